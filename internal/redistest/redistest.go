// Package redistest starts real redis-server processes for tests: single
// servers, N independent masters, a Cluster of masters and a Sentinel
// set-up, each on free loopback ports in a temporary directory, killed by
// t.Cleanup. There are no mocks: if redis-server cannot be found the test
// fails (t.Fatal), it never skips.
//
// The binary is $LOCKER_TEST_REDIS_SERVER if set, else "redis-server" on
// $PATH. Servers run without persistence (save "", appendonly no), so a
// Kill followed by Restart yields an empty server on the same port, which is
// what the failure tests need.
//
//	s := redistest.Start(t)            // one server; s.Addr is "127.0.0.1:port"
//	ms := redistest.StartN(t, 5)       // five independent masters (Redlock)
//	c := redistest.StartCluster(t, 3)  // three masters, all slots assigned, state ok
//	sn := redistest.StartSentinel(t)   // master + replica + one sentinel ("mymaster")
//	ts := redistest.StartTLS(t)        // TLS only; ts.CACert is its self-signed certificate
//	s.Kill(); s.Restart(); s.Stop(); s.Cont()
//	v, err := s.Do("GET", "k")         // one command over a raw RESP connection
package redistest

import (
	"bufio"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// StartTimeout bounds how long a server may take to answer PING after it
// was started (generous: the test machines are loaded).
const StartTimeout = 20 * time.Second

// Server is one redis-server process on 127.0.0.1.
type Server struct {
	// Addr is "127.0.0.1:<port>".
	Addr string
	// Port is the TCP port.
	Port int
	// Dir is the server's working directory (its log is Dir/redis.log).
	Dir string

	// CACert is the PEM certificate a TLS server (StartTLS) presents.
	CACert []byte

	t        testing.TB
	args     []string
	confFile string      // sentinel: the config file, first argument
	tls      *tls.Config // StartTLS: client configuration for Do

	mu  sync.Mutex
	cmd *exec.Cmd
}

// Binary returns the redis-server path: $LOCKER_TEST_REDIS_SERVER, or
// redis-server found on $PATH. It calls t.Fatal if there is none.
func Binary(t testing.TB) string {
	t.Helper()
	if p := os.Getenv("LOCKER_TEST_REDIS_SERVER"); p != "" {
		return p
	}
	p, err := exec.LookPath("redis-server")
	if err != nil {
		t.Fatalf("redistest: redis-server not found on $PATH (install redis or set LOCKER_TEST_REDIS_SERVER): %v", err)
	}
	return p
}

// Start starts a redis-server on a free port with extra config arguments
// (for example "--requirepass", "secret") and waits until it answers PING.
// It calls t.Fatal on failure; the server is killed by t.Cleanup.
func Start(t testing.TB, args ...string) *Server {
	t.Helper()
	return start(t, args, nil, nil)
}

func start(t testing.TB, args []string, tlsConf *tls.Config, caCert []byte) *Server {
	t.Helper()
	bin := Binary(t)
	var last error
	for attempt := 0; attempt < 5; attempt++ {
		s := &Server{t: t, args: args, Dir: t.TempDir(), tls: tlsConf, CACert: caCert}
		port, err := FreePort()
		if err != nil {
			t.Fatalf("redistest: %v", err)
		}
		s.Port = port
		s.Addr = "127.0.0.1:" + strconv.Itoa(port)
		if last = s.start(bin); last == nil {
			t.Cleanup(s.cleanup)
			return s
		}
	}
	t.Fatalf("redistest: cannot start redis-server: %v", last)
	return nil
}

// StartN starts n independent servers (for Redlock).
// Addrs returns the "host:port" addresses of servers, in order.
func Addrs(servers []*Server) []string {
	out := make([]string, len(servers))
	for i, s := range servers {
		out[i] = s.Addr
	}
	return out
}

func StartN(t testing.TB, n int, args ...string) []*Server {
	t.Helper()
	out := make([]*Server, n)
	for i := range out {
		out[i] = Start(t, args...)
	}
	return out
}

// RefusedPort returns a TCP port on 127.0.0.1 that refuses connections
// until t ends: a socket is bound to it without listening, which keeps any
// server (and the kernel's choice of a free port) off it meanwhile. Use it
// for "an unreachable server"; FreePort's port may be taken by a server
// started after it.
func RefusedPort(t testing.TB) int {
	t.Helper()
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatalf("redistest: socket: %v", err)
	}
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		_ = syscall.Close(fd)
		t.Fatalf("redistest: bind: %v", err)
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		_ = syscall.Close(fd)
		t.Fatalf("redistest: getsockname: %v", err)
	}
	t.Cleanup(func() { _ = syscall.Close(fd) })
	return sa.(*syscall.SockaddrInet4).Port
}

// FreePort returns a TCP port that was free on 127.0.0.1 a moment ago.
func FreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func (s *Server) start(bin string) error {
	var argv []string
	if s.confFile != "" {
		argv = append(argv, s.confFile)
	}
	port := []string{"--port", strconv.Itoa(s.Port)}
	if s.tls != nil {
		port = []string{"--port", "0", "--tls-port", strconv.Itoa(s.Port)}
	}
	argv = append(argv, port...)
	argv = append(argv, "--bind", "127.0.0.1", "--protected-mode", "no",
		"--save", "", "--appendonly", "no", "--dir", s.Dir, "--daemonize", "no",
		"--logfile", filepath.Join(s.Dir, "redis.log"))
	argv = append(argv, s.args...)
	cmd := exec.Command(bin, argv...)
	cmd.Dir = s.Dir
	// If the test binary dies without running its cleanups (killed by a
	// timeout), the kernel kills the server too.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", bin, err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	deadline := time.Now().Add(StartTimeout)
	for {
		select {
		case err := <-exited:
			return fmt.Errorf("redis-server on port %d exited: %v; log: %s", s.Port, err, s.Log())
		default:
		}
		// Any RESP reply means the server is up (a server with
		// requirepass answers PING with a NOAUTH error).
		if v, err := s.Do("PING"); (err == nil && v == "PONG") || isReplyError(err) && !strings.HasPrefix(err.Error(), "LOADING") {
			break
		}
		if time.Now().After(deadline) {
			_ = cmd.Process.Kill()
			<-exited
			return fmt.Errorf("redis-server on port %d did not answer PING within %v; log: %s", s.Port, StartTimeout, s.Log())
		}
		time.Sleep(5 * time.Millisecond) // polling a condition with a deadline
	}
	s.mu.Lock()
	s.cmd = cmd // the goroutine above reaps it whenever it exits
	s.mu.Unlock()
	return nil
}

// Log returns the server's log file content (or an error text).
func (s *Server) Log() string {
	b, err := os.ReadFile(filepath.Join(s.Dir, "redis.log"))
	if err != nil {
		return err.Error()
	}
	if len(b) > 4000 {
		b = b[len(b)-4000:]
	}
	return string(b)
}

func writeFile(path, content string) error { return os.WriteFile(path, []byte(content), 0o600) }

// URL returns "redis://127.0.0.1:<port>".
func (s *Server) URL() string { return "redis://" + s.Addr }

// Kill kills the server with SIGKILL and waits until its port is closed.
// Data is lost (there is no persistence). Killing a dead server is a no-op.
func (s *Server) Kill() {
	s.t.Helper()
	s.mu.Lock()
	cmd := s.cmd
	s.cmd = nil
	s.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Signal(syscall.SIGCONT)
	_ = cmd.Process.Kill()
	deadline := time.Now().Add(StartTimeout)
	for {
		c, err := net.DialTimeout("tcp", s.Addr, time.Second)
		if err != nil {
			return
		}
		c.Close()
		if time.Now().After(deadline) {
			s.t.Fatalf("redistest: %s still accepts connections after SIGKILL", s.Addr)
		}
		time.Sleep(5 * time.Millisecond) // polling a condition with a deadline
	}
}

// Restart starts the server again on the same port and directory, after
// Kill (it kills a running one first). It calls t.Fatal on failure.
func (s *Server) Restart() {
	s.t.Helper()
	s.Kill()
	if err := s.start(Binary(s.t)); err != nil {
		s.t.Fatalf("redistest: restart: %v", err)
	}
}

// Stop freezes the server with SIGSTOP: connections stay open, nothing
// answers. Cont resumes it.
func (s *Server) Stop() { s.signal(syscall.SIGSTOP) }

// Cont resumes a server frozen by Stop.
func (s *Server) Cont() { s.signal(syscall.SIGCONT) }

func (s *Server) signal(sig syscall.Signal) {
	s.t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		s.t.Fatalf("redistest: %s is not running", s.Addr)
	}
	if err := s.cmd.Process.Signal(sig); err != nil {
		s.t.Fatalf("redistest: signal %v: %v", sig, err)
	}
}

func (s *Server) cleanup() {
	s.mu.Lock()
	cmd := s.cmd
	s.cmd = nil
	s.mu.Unlock()
	if cmd != nil {
		_ = cmd.Process.Signal(syscall.SIGCONT)
		_ = cmd.Process.Kill()
	}
	if s.t.Failed() {
		s.t.Logf("redistest: log of %s:\n%s", s.Addr, s.Log())
	}
}

// Do sends one command on a fresh connection (5s timeout) and returns the
// reply as int64, string, []any, nil (nil reply) or an error (error reply
// or I/O error).
func (s *Server) Do(args ...string) (any, error) { return do(s.Addr, s.tls, args...) }

// Do sends one command to addr on a fresh connection (5s timeout); see
// Server.Do.
func Do(addr string, args ...string) (any, error) { return do(addr, nil, args...) }

func do(addr string, tlsConf *tls.Config, args ...string) (any, error) {
	var c net.Conn
	var err error
	if tlsConf != nil {
		c, err = tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", addr, tlsConf)
	} else {
		c, err = net.DialTimeout("tcp", addr, 5*time.Second)
	}
	if err != nil {
		return nil, err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	var b strings.Builder
	fmt.Fprintf(&b, "*%d\r\n", len(args))
	for _, a := range args {
		fmt.Fprintf(&b, "$%d\r\n%s\r\n", len(a), a)
	}
	if _, err := c.Write([]byte(b.String())); err != nil {
		return nil, err
	}
	return readReply(bufio.NewReader(c))
}

// ReplyError is an error reply from the server (as opposed to an I/O error).
type ReplyError string

// Error implements error.
func (e ReplyError) Error() string { return string(e) }

func isReplyError(err error) bool {
	var re ReplyError
	return errors.As(err, &re)
}

func readReply(r *bufio.Reader) (any, error) {
	line, err := r.ReadString('\n')
	if err != nil {
		return nil, err
	}
	line = strings.TrimSuffix(line, "\r\n")
	if line == "" {
		return nil, errors.New("redistest: empty reply line")
	}
	switch line[0] {
	case '+':
		return line[1:], nil
	case '-':
		return nil, ReplyError(line[1:])
	case ':':
		return strconv.ParseInt(line[1:], 10, 64)
	case '$':
		n, err := strconv.Atoi(line[1:])
		if err != nil || n < 0 {
			return nil, err
		}
		buf := make([]byte, n+2)
		if _, err := io.ReadFull(r, buf); err != nil {
			return nil, err
		}
		return string(buf[:n]), nil
	case '*':
		n, err := strconv.Atoi(line[1:])
		if err != nil || n < 0 {
			return nil, err
		}
		out := make([]any, n)
		for i := range out {
			if out[i], err = readReply(r); err != nil {
				return nil, err
			}
		}
		return out, nil
	}
	return nil, fmt.Errorf("redistest: unexpected reply %q", line)
}
