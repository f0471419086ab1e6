// Package pgtest starts a private PostgreSQL server for tests.
//
// Start runs initdb into a fresh temporary directory and starts the postgres
// binary from /usr/lib/postgresql/<newest>/bin (or $LOCKER_TEST_PG_BIN) on a
// free loopback port, with trust authentication for the superuser
// "postgres" and the database "postgres". When the test runs as root, the
// directory is chowned to the "postgres" OS user and the server runs as that
// user (PostgreSQL refuses to run as root).
//
// Kill, Stop and Cont signal the postmaster and every backend (its
// children) at once. Everything is torn down with
// tb.Cleanup: the process group is continued (if stopped) and killed, and the
// directory removed.
//
// A missing binary is a test failure (tb.Fatal), never a skip.
//
// Typical use:
//
//	srv := pgtest.Start(t)
//	pool, err := pgxpool.New(ctx, srv.URL())
//	...
//	srv.Restart(t) // crash (SIGKILL of every server process) and start again
package pgtest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// EnvBin names the environment variable that overrides the directory holding
// initdb and postgres.
const EnvBin = "LOCKER_TEST_PG_BIN"

// StartTimeout bounds how long Start and Restart wait for the server to
// accept connections. It is generous because the test machine may be loaded.
const StartTimeout = 90 * time.Second

// Server is a private PostgreSQL server. Its methods may be called from
// several goroutines.
type Server struct {
	bin      string
	dir      string // data directory (dir/data) and socket directory (dir)
	port     int
	settings []string
	cred     *syscall.Credential

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{} // closed when cmd has been waited for
	log  *syncBuffer
}

// Start creates, starts and registers cleanup of a private server. settings
// are extra server settings as "name=value" (passed as -c name=value), for
// example "max_connections=20". It calls tb.Fatal when the binaries are
// missing or the server does not come up within StartTimeout.
func Start(tb testing.TB, settings ...string) *Server {
	tb.Helper()
	s, err := Launch(settings...)
	if err != nil {
		tb.Fatalf("pgtest: %v", err)
	}
	tb.Cleanup(s.Close)
	return s
}

// Launch is Start for use outside a test (in TestMain, for a server shared
// by a package's tests): the caller must call Close. It returns an error
// when the binaries are missing or the server does not come up.
func Launch(settings ...string) (*Server, error) {
	bin, err := findBin()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "pgtest-")
	if err != nil {
		return nil, err
	}
	s := &Server{bin: bin, dir: dir, settings: settings}
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			s.Close()
			return nil, fmt.Errorf("running as root needs a postgres OS user: %v", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		s.cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
		if err := os.Chown(dir, uid, gid); err != nil {
			s.Close()
			return nil, err
		}
	}
	initdb := s.command(filepath.Join(bin, "initdb"), "-D", s.dataDir(), "-U", "postgres",
		"--auth=trust", "--encoding=UTF8", "--locale=C", "--no-sync", "--no-instructions")
	if out, err := initdb.CombinedOutput(); err != nil {
		s.Close()
		return nil, fmt.Errorf("initdb: %v\n%s", err, out)
	}
	// A port taken between our probe and the server's bind makes start fail;
	// pick another one a few times.
	var lastErr error
	for range 5 {
		s.port, err = freePort()
		if err != nil {
			s.Close()
			return nil, err
		}
		if lastErr = s.start(); lastErr == nil {
			return s, nil
		}
		s.teardown()
	}
	s.Close()
	return nil, fmt.Errorf("postgres did not start: %v", lastErr)
}

// Close kills the server (continuing it first if stopped) and removes its
// directory. It is idempotent.
func (s *Server) Close() {
	s.teardown()
	_ = os.RemoveAll(s.dir)
}

// URL returns a connection URL for database "postgres" as user "postgres",
// for example postgres://postgres@127.0.0.1:54321/postgres?sslmode=disable.
func (s *Server) URL() string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", s.port)
}

// Addr returns the server's host:port.
func (s *Server) Addr() string { return fmt.Sprintf("127.0.0.1:%d", s.port) }

// DataDir returns the server's data directory (owned by the postgres OS user
// when the tests run as root). After editing pg_hba.conf or
// postgresql.conf there, run SELECT pg_reload_conf().
func (s *Server) DataDir() string { return s.dataDir() }

// StartStandby makes a streaming-replication hot standby of s
// (pg_basebackup -R) and starts it on its own free port, with cleanup
// registered on tb. Its URL connects to a server in recovery: read-only,
// pg_is_in_recovery() true.
func (s *Server) StartStandby(tb testing.TB) *Server {
	tb.Helper()
	dir, err := os.MkdirTemp("", "pgtest-standby-")
	if err != nil {
		tb.Fatalf("pgtest: %v", err)
	}
	st := &Server{bin: s.bin, dir: dir, settings: s.settings, cred: s.cred}
	tb.Cleanup(st.Close)
	if st.cred != nil {
		if err := os.Chown(dir, int(st.cred.Uid), int(st.cred.Gid)); err != nil {
			tb.Fatalf("pgtest: %v", err)
		}
	}
	bb := st.command(filepath.Join(s.bin, "pg_basebackup"), "-D", st.dataDir(), "-R", "-X", "stream",
		"-h", "127.0.0.1", "-p", strconv.Itoa(s.port), "-U", "postgres", "--no-sync")
	if out, err := bb.CombinedOutput(); err != nil {
		tb.Fatalf("pgtest: pg_basebackup: %v\n%s", err, out)
	}
	for range 5 {
		if st.port, err = freePort(); err != nil {
			tb.Fatalf("pgtest: %v", err)
		}
		if err = st.start(); err == nil {
			return st
		}
		st.teardown()
	}
	tb.Fatalf("pgtest: standby did not start: %v", err)
	return nil
}

// Port returns the server's TCP port. It does not change across Restart.
func (s *Server) Port() int { return s.port }

// Log returns what the server has written to stderr since it last started.
func (s *Server) Log() string {
	s.mu.Lock()
	log := s.log
	s.mu.Unlock()
	if log == nil {
		return ""
	}
	return log.String()
}

// Kill crashes the server: SIGKILL to the postmaster and every backend. Held
// sessions end at once, without a shutdown checkpoint.
func (s *Server) Kill(tb testing.TB) {
	tb.Helper()
	s.signal(syscall.SIGCONT)
	s.teardown()
}

// Restart crashes the server (as Kill; nothing to do if it was stopped by
// StopImmediate) and starts it again on the same port
// and data directory; it returns once the server accepts connections (crash
// recovery included).
func (s *Server) Restart(tb testing.TB) {
	tb.Helper()
	s.Kill(tb)
	if err := s.start(); err != nil {
		tb.Fatalf("pgtest: restart: %v", err)
	}
}

// StopImmediate stops the server with an immediate shutdown (SIGQUIT to the
// postmaster, which makes every backend quit at once, without a checkpoint,
// as pg_ctl stop -m immediate does) and waits for it to exit. Restart starts
// it again on the same port and data directory, with crash recovery.
func (s *Server) StopImmediate(tb testing.TB) {
	tb.Helper()
	s.mu.Lock()
	cmd, done := s.cmd, s.done
	s.mu.Unlock()
	if cmd == nil || cmd.Process == nil {
		tb.Fatal("pgtest: StopImmediate: server not running")
	}
	_ = syscall.Kill(cmd.Process.Pid, syscall.SIGQUIT)
	select {
	case <-done:
	case <-time.After(StartTimeout):
		tb.Fatalf("pgtest: postmaster did not exit within %v of an immediate shutdown", StartTimeout)
	}
	s.teardown() // reaps backends that are still exiting
}

// Stop freezes the server with SIGSTOP to the postmaster and every backend:
// connections stay open but nothing answers, and no server timer fires.
func (s *Server) Stop(tb testing.TB) {
	tb.Helper()
	s.signal(syscall.SIGSTOP)
}

// Cont resumes a server frozen by Stop.
func (s *Server) Cont(tb testing.TB) {
	tb.Helper()
	s.signal(syscall.SIGCONT)
}

func (s *Server) dataDir() string { return filepath.Join(s.dir, "data") }

func (s *Server) command(name string, args ...string) *exec.Cmd {
	cmd := exec.Command(name, args...)
	cmd.Env = append(os.Environ(), "LC_ALL=C", "LANG=C")
	cmd.Dir = s.dir
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Credential: s.cred}
	return cmd
}

func (s *Server) start() error {
	args := []string{"-D", s.dataDir(),
		"-c", "listen_addresses=127.0.0.1",
		"-c", "port=" + strconv.Itoa(s.port),
		"-c", "unix_socket_directories=" + s.dir,
		"-c", "shared_buffers=16MB",
		"-c", "max_connections=100",
		"-c", "logging_collector=off",
	}
	for _, kv := range s.settings {
		args = append(args, "-c", kv)
	}
	cmd := s.command(filepath.Join(s.bin, "postgres"), args...)
	log := &syncBuffer{}
	cmd.Stdout = log
	cmd.Stderr = log
	if err := cmd.Start(); err != nil {
		return err
	}
	done := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(done)
	}()
	s.mu.Lock()
	s.cmd, s.done, s.log = cmd, done, log
	s.mu.Unlock()

	ctx, cancel := context.WithTimeout(context.Background(), StartTimeout)
	defer cancel()
	for {
		c, err := pgconn.Connect(ctx, s.URL()+"&connect_timeout=5")
		if err == nil {
			_ = c.Close(ctx)
			return nil
		}
		select {
		case <-done:
			return fmt.Errorf("postgres exited: %s", log.String())
		case <-ctx.Done():
			return fmt.Errorf("not ready after %v: %v\n%s", StartTimeout, err, log.String())
		case <-time.After(20 * time.Millisecond): // readiness poll, bounded by ctx
		}
	}
}

// signal sends sig to the postmaster and its children. Backends call
// setsid(), so a process-group signal would miss them.
func (s *Server) signal(sig syscall.Signal) {
	s.mu.Lock()
	cmd := s.cmd
	s.mu.Unlock()
	if cmd == nil || cmd.Process == nil {
		return
	}
	pid := cmd.Process.Pid
	if sig == syscall.SIGCONT {
		_ = syscall.Kill(pid, sig)
	}
	for _, c := range children(pid) {
		_ = syscall.Kill(c, sig)
	}
	if sig != syscall.SIGCONT {
		_ = syscall.Kill(pid, sig)
	}
}

// teardown kills the postmaster and every backend and waits until they are
// all gone, so that a restart finds the port and shared memory free.
func (s *Server) teardown() {
	s.mu.Lock()
	cmd, done := s.cmd, s.done
	s.cmd = nil
	s.mu.Unlock()
	if cmd == nil || cmd.Process == nil {
		return
	}
	pid := cmd.Process.Pid
	kids := children(pid)
	_ = syscall.Kill(pid, syscall.SIGKILL) // first, so it forks nothing new
	for _, c := range kids {
		_ = syscall.Kill(c, syscall.SIGCONT)
		_ = syscall.Kill(c, syscall.SIGKILL)
	}
	_ = syscall.Kill(pid, syscall.SIGCONT)
	<-done
	deadline := time.Now().Add(30 * time.Second)
	for _, c := range kids {
		for time.Now().Before(deadline) {
			if err := syscall.Kill(c, 0); errors.Is(err, syscall.ESRCH) || isZombieOrGone(c) {
				break
			}
			time.Sleep(5 * time.Millisecond) // poll for process exit, bounded above
		}
	}
}

// children lists the pids whose parent is pid, from /proc.
func children(pid int) []int {
	ents, _ := os.ReadDir("/proc")
	var out []int
	for _, e := range ents {
		c, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if ppid(c) == pid {
			out = append(out, c)
		}
	}
	return out
}

// procStat returns the state and parent pid fields of /proc/pid/stat.
func procStat(pid int) (state string, parent int) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return "", -1
	}
	// The command name may contain spaces; fields resume after the last ')'.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return "", -1
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 2 {
		return "", -1
	}
	parent, _ = strconv.Atoi(f[1])
	return f[0], parent
}

func ppid(pid int) int { _, p := procStat(pid); return p }

func isZombieOrGone(pid int) bool {
	st, _ := procStat(pid)
	return st == "" || st == "Z"
}

func findBin() (string, error) {
	if dir := os.Getenv(EnvBin); dir != "" {
		if _, err := os.Stat(filepath.Join(dir, "postgres")); err != nil {
			return "", fmt.Errorf("%s=%s: %v", EnvBin, dir, err)
		}
		return dir, nil
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(i, j int) bool { return version(dirs[i]) > version(dirs[j]) })
	for _, d := range dirs {
		if _, err := os.Stat(filepath.Join(d, "postgres")); err == nil {
			if _, err := os.Stat(filepath.Join(d, "initdb")); err == nil {
				return d, nil
			}
		}
	}
	return "", fmt.Errorf("no PostgreSQL server binaries (initdb, postgres) under /usr/lib/postgresql/*/bin; install postgresql or set %s", EnvBin)
}

func version(binDir string) int {
	v, _ := strconv.Atoi(strings.Split(filepath.Base(filepath.Dir(binDir)), ".")[0])
	return v
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
