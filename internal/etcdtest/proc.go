package etcdtest

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"time"
)

// stopTimeout bounds a graceful Stop; the member is killed after it.
const stopTimeout = 60 * time.Second

// proc is one running etcdserver process.
type proc struct {
	cmd   *exec.Cmd
	log   string
	stdin *os.File // its stdin: closing it kills the process
	lines chan string
	done  chan struct{} // closed once the process has exited

	qmu sync.Mutex // one status query at a time
}

// startProc starts the server with args, its stderr appended to logPath,
// and returns once it serves clients.
func startProc(logPath string, args ...string) (*proc, error) {
	bin, err := serverBinary()
	if err != nil {
		return nil, err
	}
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	inR, inW, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	outR, outW, err := os.Pipe()
	if err != nil {
		inR.Close()
		inW.Close()
		return nil, err
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = inR, outW, logf
	err = cmd.Start()
	inR.Close()
	outW.Close()
	if err != nil {
		inW.Close()
		outR.Close()
		return nil, err
	}
	p := &proc{cmd: cmd, log: logPath, stdin: inW, lines: make(chan string, 1), done: make(chan struct{})}
	go p.read(outR)
	go func() { _ = cmd.Wait(); close(p.done) }()
	select {
	case l := <-p.lines:
		if l == "ready" {
			return p, nil
		}
		p.kill()
		return nil, fmt.Errorf("unexpected output %q", l)
	case <-p.done:
		return nil, fmt.Errorf("exited before serving: %s", p.tail())
	case <-time.After(StartTimeout):
		p.kill()
		return nil, fmt.Errorf("not ready after %v: %s", StartTimeout, p.tail())
	}
}

func (p *proc) read(r *os.File) {
	defer r.Close()
	s := bufio.NewScanner(r)
	for s.Scan() {
		select {
		case p.lines <- s.Text():
		case <-p.done:
			return
		}
	}
}

// status asks the server for its leader's id and its own.
func (p *proc) status() (leader, self uint64, ok bool) {
	p.qmu.Lock()
	defer p.qmu.Unlock()
	select { // the answer to an earlier query that timed out
	case <-p.lines:
	default:
	}
	if _, err := p.stdin.Write([]byte("status\n")); err != nil {
		return 0, 0, false
	}
	select {
	case l := <-p.lines:
		if _, err := fmt.Sscanf(l, "status %d %d", &leader, &self); err != nil {
			return 0, 0, false
		}
		return leader, self, true
	case <-p.done:
	case <-time.After(10 * time.Second):
	}
	return 0, 0, false
}

// kill sends SIGKILL and waits until the process has exited.
func (p *proc) kill() {
	_ = p.cmd.Process.Kill()
	<-p.done
	p.stdin.Close()
}

// stop sends SIGTERM and waits until the process has exited, killing it
// after stopTimeout.
func (p *proc) stop() {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(stopTimeout):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
	p.stdin.Close()
}

// tail returns the end of the server's log, for an error.
func (p *proc) tail() string {
	b, _ := os.ReadFile(p.log)
	s := strings.TrimSpace(string(b))
	if len(s) > 2000 {
		s = s[len(s)-2000:]
	}
	if s == "" {
		return "(no log)"
	}
	return s
}

var build struct {
	once sync.Once
	path string
	err  error
}

// serverBinary builds ./etcdserver without the race detector, once per
// process, into a directory shared by the test processes of this user; a
// lock serialises their builds, so that the ones after the first find every
// package in the build cache.
func serverBinary() (string, error) {
	build.once.Do(func() { build.path, build.err = buildServer() })
	return build.path, build.err
}

func buildServer() (string, error) {
	src, err := sourceDir()
	if err != nil {
		return "", err
	}
	dir := filepath.Join(os.TempDir(), fmt.Sprintf("locker-etcdtest-%d", os.Getuid()))
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", err
	}
	lock, err := os.OpenFile(filepath.Join(dir, "build.lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return "", err
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		return "", err
	}
	tmp := filepath.Join(dir, fmt.Sprintf("etcdserver.%d.tmp", os.Getpid()))
	cmd := exec.Command(goTool(), "build", "-o", tmp, ".")
	cmd.Dir = src
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOFLAGS=")
	if out, err := cmd.CombinedOutput(); err != nil {
		os.Remove(tmp)
		return "", fmt.Errorf("etcdtest: building the etcd server: %v\n%s", err, out)
	}
	bin := filepath.Join(dir, "etcdserver")
	if err := os.Rename(tmp, bin); err != nil {
		return "", err
	}
	return bin, nil
}

// sourceDir is the directory of ./etcdserver, found from this file's path.
func sourceDir() (string, error) {
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		return "", errors.New("etcdtest: cannot locate the etcdserver source")
	}
	return filepath.Join(filepath.Dir(file), "etcdserver"), nil
}

// goTool is the go command: on PATH (go test puts GOROOT/bin first), else
// in GOROOT.
func goTool() string {
	if p, err := exec.LookPath("go"); err == nil {
		return p
	}
	if r := os.Getenv("GOROOT"); r != "" {
		return filepath.Join(r, "bin", "go")
	}
	return "go"
}
