package main

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// The end-to-end tests build the command once and run it as real
// processes. The test binary doubles as the command locker runs (the child):
// see childMain.

var (
	binary     string   // the built locker command
	buildFlags []string // -race when the tests run with it
)

func TestMain(m *testing.M) {
	if mode := os.Getenv("LOCKER_TEST_CHILD"); mode != "" {
		os.Exit(childMain(mode, os.Args[1:]))
	}
	os.Exit(buildAndRun(m))
}

func buildAndRun(m *testing.M) int {
	dir, err := os.MkdirTemp("", "locker-cmd-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	binary = filepath.Join(dir, "locker")
	args := append([]string{"build", "-o", binary}, buildFlags...)
	build := exec.Command("go", append(args, ".")...)
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "building the locker command:", err)
		return 1
	}
	return m.Run()
}

// childMain is the command run under the lock in the tests. It prints
// "ready token=T key=K" when started, then:
//
//	exit N          exit with code N
//	record LOG D    append "start T" to LOG, wait D, append "end T", exit 0
//	signals         report each signal on stdout; exit 7 on SIGTERM or SIGINT
//	stubborn        ignore SIGTERM; run until killed
//	trap PIDFILE    write the pid to PIDFILE (before "ready"); on SIGTERM print
//	                "term T" (T: CLOCK_MONOTONIC, ns) and keep running until killed
//	checkdead PIDFILE  print "dead" if the process in PIDFILE has exited,
//	                else "alive"
//	read            echo each line of stdin as "read LINE"; exit 7 on SIGINT
func childMain(mode string, args []string) int {
	token, key := os.Getenv("LOCKER_TOKEN"), os.Getenv("LOCKER_KEY")
	sigs := make(chan os.Signal, 8)
	switch mode {
	case "signals":
		signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGUSR1, syscall.SIGHUP)
	case "stubborn":
		signal.Ignore(syscall.SIGTERM)
	case "trap":
		signal.Notify(sigs, syscall.SIGTERM)
		if err := writePid(args[0]); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 99
		}
	case "read":
		signal.Notify(sigs, syscall.SIGINT)
	}
	fmt.Printf("ready token=%s key=%s\n", token, key)
	switch mode {
	case "exit":
		n, _ := strconv.Atoi(args[0])
		return n
	case "record":
		d, _ := time.ParseDuration(args[1])
		appendLine(args[0], "start "+token)
		time.Sleep(d) // the work done under the lock
		appendLine(args[0], "end "+token)
		return 0
	case "signals":
		for s := range sigs {
			fmt.Printf("got %v\n", s)
			if s == syscall.SIGTERM || s == syscall.SIGINT {
				return 7
			}
		}
	case "stubborn":
		for {
			time.Sleep(time.Hour) // until killed
		}
	case "trap":
		for range sigs {
			fmt.Printf("term %d\n", mono())
		}
	case "checkdead":
		pid, err := readPid(args[0])
		if err != nil {
			fmt.Println(err)
			return 99
		}
		if dead(pid) {
			fmt.Println("dead")
		} else {
			fmt.Println("alive")
		}
		return 0
	case "read":
		lines := make(chan string)
		go func() {
			sc := bufio.NewScanner(os.Stdin)
			for sc.Scan() {
				lines <- sc.Text()
			}
			close(lines)
		}()
		for {
			select {
			case l, ok := <-lines:
				if !ok {
					return 0
				}
				fmt.Printf("read %s\n", l)
			case <-sigs:
				fmt.Println("got interrupt")
				return 7
			}
		}
	}
	return 99
}

// mono returns CLOCK_MONOTONIC, which all processes of the host share.
func mono() time.Duration {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		panic(err)
	}
	return time.Duration(ts.Nano())
}

func writePid(path string) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(strconv.Itoa(os.Getpid())), 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

func readPid(path string) (int, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(string(b))
}

// dead reports whether process pid has exited (a zombie runs nothing).
func dead(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return true
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || i+2 >= len(s) || s[i+2] == 'Z' || s[i+2] == 'X'
}

// inSh returns a command line that runs args as a child of sh, which then
// runs another command: args is locker's grandchild, in the group of sh.
func inSh(args ...string) []string {
	return append([]string{"sh", "-c", `"$@"; echo after`, "sh"}, args...)
}

// watchDeath reports, on the returned channel, the CLOCK_MONOTONIC time at
// which process pid was seen to exit, waiting on a pidfd (no polling).
func watchDeath(t *testing.T, pid int) <-chan time.Duration {
	t.Helper()
	c := make(chan time.Duration, 1)
	fd, err := unix.PidfdOpen(pid, 0)
	if errors.Is(err, unix.ESRCH) {
		c <- mono()
		return c
	}
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		defer unix.Close(fd)
		for {
			fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
			if _, err := unix.Poll(fds, -1); errors.Is(err, unix.EINTR) {
				continue
			}
			c <- mono()
			return
		}
	}()
	return c
}

// awaitDeath waits for watchDeath's report.
func awaitDeath(t *testing.T, death <-chan time.Duration, what string) time.Duration {
	t.Helper()
	select {
	case d := <-death:
		return d
	case <-time.After(60 * time.Second):
		t.Fatalf("%s is still alive", what)
		return 0
	}
}

func appendLine(path, line string) {
	f, err := os.OpenFile(path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o600)
	if err != nil {
		panic(err)
	}
	defer f.Close()
	if _, err := f.WriteString(line + "\n"); err != nil {
		panic(err)
	}
}

// child returns the command line that runs childMain in mode.
func child(mode string, args ...string) []string {
	return append([]string{"env", "LOCKER_TEST_CHILD=" + mode, childBinary()}, args...)
}

// childBinary is the program that runs childMain: this test binary.
func childBinary() string { return os.Args[0] }

// proc is a running locker command.
type proc struct {
	cmd    *exec.Cmd
	lines  chan string // stdout, line by line
	stderr *syncBuffer
	done   chan struct{}
	code   int
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// start runs the locker command with args and env (added to the test's).
// Its stdout is read line by line until every process holding it (locker
// and the command) has closed it.
func start(t testing.TB, env []string, args ...string) *proc {
	t.Helper()
	return startCmd(t, exec.Command(binary, args...), env)
}

// startCmd is start with a command prepared by the caller (its stdin and
// process attributes).
func startCmd(t testing.TB, cmd *exec.Cmd, env []string) *proc {
	t.Helper()
	cmd.Env = append(append(os.Environ(), "LOCKER_TEST_PARENT="+strconv.Itoa(os.Getpid())), env...)
	p := &proc{cmd: cmd, lines: make(chan string, 1000), stderr: &syncBuffer{}, done: make(chan struct{})}
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	er, ew, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	// Plain files, so that Wait does not wait for orphaned commands that
	// still hold them.
	cmd.Stdout, cmd.Stderr = w, ew
	err = cmd.Start()
	w.Close()
	ew.Close()
	if err != nil {
		r.Close()
		er.Close()
		t.Fatal(err)
	}
	stderrDone := make(chan struct{})
	go func() {
		defer close(stderrDone)
		defer er.Close()
		_, _ = io.Copy(p.stderr, er)
	}()
	go func() {
		defer r.Close()
		sc := bufio.NewScanner(r)
		for sc.Scan() {
			p.lines <- sc.Text()
		}
		close(p.lines)
	}()
	go func() {
		_ = cmd.Wait()
		select { // stderr is complete once locker is gone, unless a command kept it
		case <-stderrDone:
		case <-time.After(time.Second):
		}
		p.code = cmd.ProcessState.ExitCode()
		if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			p.code = 128 + int(ws.Signal())
		}
		close(p.done)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-p.done
		killOrphans(t)
	})
	return p
}

// run runs the locker command to completion.
func run(t *testing.T, env []string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	p := start(t, env, args...)
	code = p.wait(t)
	var out []string
	timeout := time.After(60 * time.Second)
	for {
		select {
		case l, ok := <-p.lines:
			if !ok {
				return code, strings.Join(out, "\n"), p.stderr.String()
			}
			out = append(out, l)
		case <-timeout:
			t.Fatalf("locker %v: output not closed", p.cmd.Args[1:])
		}
	}
}

// wait returns the exit code.
func (p *proc) wait(t testing.TB) int {
	t.Helper()
	select {
	case <-p.done:
		return p.code
	case <-time.After(60 * time.Second):
		t.Fatalf("locker %v did not exit; stderr: %s", p.cmd.Args[1:], p.stderr.String())
		return -1
	}
}

// expect waits for a stdout line starting with one of prefixes and returns
// it.
func (p *proc) expect(t testing.TB, prefixes ...string) string {
	t.Helper()
	timeout := time.After(60 * time.Second)
	for {
		select {
		case l, ok := <-p.lines:
			if !ok {
				t.Fatalf("locker exited (code %d) before printing %q; stderr: %s", p.wait(t), prefixes, p.stderr.String())
			}
			for _, prefix := range prefixes {
				if strings.HasPrefix(l, prefix) {
					return l
				}
			}
		case <-timeout:
			t.Fatalf("no line %q; stderr: %s", prefixes, p.stderr.String())
		}
	}
}

func (p *proc) signal(t testing.TB, s os.Signal) {
	t.Helper()
	if err := p.cmd.Process.Signal(s); err != nil {
		t.Fatal(err)
	}
}

// checkOneLine checks that stderr is one "locker: " line containing want.
func checkOneLine(t *testing.T, stderr, want string) {
	t.Helper()
	lines := strings.Split(strings.TrimRight(stderr, "\n"), "\n")
	if len(lines) != 1 || !strings.HasPrefix(lines[0], "locker: ") || strings.HasPrefix(lines[0], "locker: locker:") || !strings.Contains(lines[0], want) {
		t.Errorf("stderr = %q, want one \"locker: \" line containing %q", stderr, want)
	}
}

// fileURL returns a fresh file:// backend for one test.
func fileURL(t testing.TB) string { return "file://" + t.TempDir() }

// tokenOf extracts the token from a child's ready line.
func tokenOf(t testing.TB, ready string) uint64 {
	t.Helper()
	f := strings.Fields(ready)
	tok, err := strconv.ParseUint(strings.TrimPrefix(f[1], "token="), 10, 64)
	if err != nil {
		t.Fatalf("ready line %q: %v", ready, err)
	}
	return tok
}

// drain discards the rest of p's output.
func drain(p *proc) {
	go func() {
		for range p.lines {
		}
	}()
}
