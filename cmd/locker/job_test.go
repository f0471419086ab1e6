package main

import (
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/driver"
	"github.com/go-locker/locker/internal/redistest"
	"golang.org/x/sys/unix"
)

// The job is a process group: its processes get the signals locker forwards
// and are stopped on loss, and locker waits for all of them.

// termAt parses the "term T" line of a trap child.
func termAt(t *testing.T, line string) time.Duration {
	t.Helper()
	ns, err := strconv.ParseInt(strings.TrimPrefix(line, "term "), 10, 64)
	if err != nil {
		t.Fatalf("trap line %q: %v", line, err)
	}
	return time.Duration(ns)
}

// waitStderr waits until p's stderr contains want.
func waitStderr(t *testing.T, p *proc, want string) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for !strings.Contains(p.stderr.String(), want) {
		if time.Now().After(deadline) {
			t.Fatalf("stderr never said %q: %s", want, p.stderr.String())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// Renewals fail (the Redis server is stopped with SIGSTOP) while the job
// runs: its process group gets SIGTERM --grace (default TTL/4) before the
// lock's safe deadline and SIGKILL at it, so that a member that ignores
// SIGTERM (a grandchild, behind sh) is dead before a second `locker run`,
// waiting on the same key, is granted the lock once the server's TTL has
// run out and starts its command.
func TestRunRenewalFailureStopsGroupBeforeExpiry(t *testing.T) {
	s := redistest.Start(t)
	pidfile := filepath.Join(t.TempDir(), "pid")
	const ttl = 3 * time.Second
	grace := defaultGrace(ttl)
	margin := driver.Capabilities{}.Margin(ttl)
	spawned := mono()
	a := start(t, nil, append([]string{"run", "--url", s.URL(), "--ttl", ttl.String(), "job", "--"}, inSh(child("trap", pidfile)...)...)...)
	a.expect(t, "ready")
	pid, err := readPid(pidfile)
	if err != nil {
		t.Fatal(err)
	}
	death := watchDeath(t, pid)
	// The server's expiry of the lock, on this host's monotonic clock.
	asked := mono()
	reply, err := s.Do("PTTL", "locker:{job}")
	if err != nil {
		t.Fatal(err)
	}
	pttl, ok := reply.(int64)
	if !ok || pttl <= 0 {
		t.Fatalf("PTTL = %v", reply)
	}
	expiry := asked + time.Duration(pttl)*time.Millisecond

	b := start(t, nil, append([]string{"run", "-v", "--url", s.URL(), "--wait", "1m", "job", "--"}, child("checkdead", pidfile)...)...)
	waitStderr(t, b, "waiting for")
	s.Stop()
	term := termAt(t, a.expect(t, "term "))
	// Resume the server just after its TTL: b is granted the key at once.
	time.Sleep(expiry + 5*time.Millisecond - mono())
	s.Cont()
	if got := b.expect(t, "alive", "dead"); got != "dead" {
		t.Fatalf("the second run started its command while the first run's grandchild was %s", got)
	}
	died := awaitDeath(t, death, "the grandchild")
	drain(a)
	if code := a.wait(t); code != exitLost {
		t.Fatalf("first run: code %d, want %d; stderr %s", code, exitLost, a.stderr.String())
	}
	if code := b.wait(t); code != 0 {
		t.Fatalf("second run: code %d; stderr %s", code, b.stderr.String())
	}
	for _, want := range []string{"sending SIGTERM to the command's process group", "sending SIGKILL to the command's process group"} {
		if !strings.Contains(a.stderr.String(), want) {
			t.Errorf("first run's stderr lacks %q: %s", want, a.stderr.String())
		}
	}
	t.Logf("SIGTERM %v before the server's expiry (grace %v), death %v after SIGTERM", expiry-term, grace, died-term)
	// SIGTERM: no earlier than the grace before the earliest possible
	// deadline, and at least grace (less 100ms of scheduling on a loaded
	// machine) before the server's expiry.
	if early := spawned + ttl - margin - grace; term < early {
		t.Errorf("SIGTERM %v before the earliest safe deadline minus grace", early-term)
	}
	if term > expiry-grace+100*time.Millisecond {
		t.Errorf("SIGTERM only %v before the server's expiry, want %v", expiry-term, grace)
	}
	// SIGKILL at the deadline, not with SIGTERM; the group was dead before
	// the server let the key go.
	if died-term < grace/2 {
		t.Errorf("the grandchild died %v after SIGTERM: killed long before the deadline", died-term)
	}
	if died > expiry {
		t.Errorf("the grandchild died %v after the server's expiry", died-expiry)
	}
}

// A locker stopped (SIGSTOP) past its TTL, whose lock is taken by another
// run meanwhile, kills its command's whole group at once when continued:
// SIGKILL, not SIGTERM followed by SIGKILL after --grace.
func TestRunPausedPastTTLKillsGroupOnResume(t *testing.T) {
	url := fileURL(t)
	pidfile := filepath.Join(t.TempDir(), "pid")
	const grace = 400 * time.Millisecond
	a := start(t, nil, append([]string{"run", "--url", url, "--ttl", "1s", "--grace", grace.String(), "job", "--"}, inSh(child("trap", pidfile)...)...)...)
	a.expect(t, "ready")
	pid, err := readPid(pidfile)
	if err != nil {
		t.Fatal(err)
	}
	death := watchDeath(t, pid)
	a.signal(t, syscall.SIGSTOP)
	code, _, stderr := run(t, nil, append([]string{"run", "--url", url, "--wait", "1m", "job", "--"}, child("exit", "0")...)...)
	if code != 0 {
		t.Fatalf("taking the key from a stopped locker: code %d, %s", code, stderr)
	}
	select {
	case <-death:
		t.Fatal("the grandchild died while locker was stopped")
	default:
	}
	resumed := mono()
	a.signal(t, syscall.SIGCONT)
	died := awaitDeath(t, death, "the grandchild")
	t.Logf("group killed %v after SIGCONT", died-resumed)
	if died-resumed >= grace {
		t.Errorf("the grandchild died %v after locker was continued, want at once (under --grace %v)", died-resumed, grace)
	}
	drain(a)
	if code := a.wait(t); code != exitLost {
		t.Fatalf("code %d, want %d; stderr %s", code, exitLost, a.stderr.String())
	}
	if !strings.Contains(a.stderr.String(), "sending SIGKILL to the command's process group") || strings.Contains(a.stderr.String(), "SIGTERM") {
		t.Fatalf("stderr: %s", a.stderr.String())
	}
}

// Signals sent to locker reach the whole group: a grandchild behind sh gets
// SIGTERM.
func TestRunForwardsSignalsToGroup(t *testing.T) {
	url := fileURL(t)
	p := start(t, nil, append([]string{"run", "--url", url, "job", "--"}, inSh(child("signals")...)...)...)
	p.expect(t, "ready")
	p.signal(t, syscall.SIGTERM)
	if got := p.expect(t, "got"); got != "got terminated" {
		t.Fatalf("grandchild said %q", got)
	}
	// sh itself was killed by the SIGTERM: 128+15.
	if code := p.wait(t); code != 128+int(syscall.SIGTERM) {
		t.Fatalf("code %d, want %d; stderr %s", code, 128+int(syscall.SIGTERM), p.stderr.String())
	}
}

// When the command exits and leaves processes in its group, locker holds
// the lock until they have exited too, then exits with the command's code.
func TestRunWaitsForGroup(t *testing.T) {
	url := fileURL(t)
	pidfile := filepath.Join(t.TempDir(), "pid")
	p := start(t, nil, "run", "-v", "--url", url, "job", "--", "sh", "-c", `"$@" & exit 3`, "sh", "env", "LOCKER_TEST_CHILD=trap", childBinary(), pidfile)
	p.expect(t, "ready")
	waitStderr(t, p, "command exited with code 3")
	waitStderr(t, p, "waiting for the rest of process group")
	if isFree(t, url, "job") {
		t.Fatal("lock released while a process of the job still ran")
	}
	pid, err := readPid(pidfile)
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if code := p.wait(t); code != 3 {
		t.Fatalf("code %d, want the command's 3; stderr %s", code, p.stderr.String())
	}
	if !isFree(t, url, "job") {
		t.Fatal("lock held after the job ended")
	}
}

func TestDefaultGrace(t *testing.T) {
	for ttl, want := range map[time.Duration]time.Duration{
		100 * time.Millisecond: 25 * time.Millisecond,
		time.Second:            250 * time.Millisecond,
		30 * time.Second:       7500 * time.Millisecond,
		40 * time.Second:       10 * time.Second,
		time.Hour:              10 * time.Second,
	} {
		if got := defaultGrace(ttl); got != want {
			t.Errorf("defaultGrace(%v) = %v, want %v", ttl, got, want)
		}
	}
}

// openPty returns a new pseudo-terminal's controller and terminal sides.
func openPty(t *testing.T) (ptmx, tty *os.File) {
	t.Helper()
	ptmx, err := os.OpenFile("/dev/ptmx", os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ptmx.Close() })
	if err := unix.IoctlSetPointerInt(int(ptmx.Fd()), unix.TIOCSPTLCK, 0); err != nil {
		t.Fatal(err)
	}
	n, err := unix.IoctlGetInt(int(ptmx.Fd()), unix.TIOCGPTN)
	if err != nil {
		t.Fatal(err)
	}
	tty, err = os.OpenFile("/dev/pts/"+strconv.Itoa(n), os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tty.Close() })
	go func() { _, _ = io.Copy(io.Discard, ptmx) }() // the echo
	return ptmx, tty
}

// procState returns the state letter of process pid (R, S, T, Z…).
func procState(t *testing.T, pid int) byte {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		t.Fatal(err)
	}
	i := strings.LastIndexByte(string(b), ')')
	return b[i+2]
}

// Run from an interactive shell, in the foreground of a terminal, the job
// gets the terminal: it reads from it, and Ctrl-C and Ctrl-Z reach its
// group. On Ctrl-Z locker stops too, as a shell job does, and when
// continued it continues the job.
func TestRunOnTerminal(t *testing.T) {
	url := fileURL(t)
	ptmx, tty := openPty(t)
	cmd := exec.Command(binary, append([]string{"run", "--url", url, "job", "--"}, child("read")...)...)
	cmd.Stdin = tty
	// A session of its own with the terminal as its controlling terminal,
	// locker in its foreground process group, as a login shell sets up.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0}
	p := startCmd(t, cmd, nil)
	p.expect(t, "ready")
	type_ := func(s string) {
		t.Helper()
		if _, err := ptmx.WriteString(s); err != nil {
			t.Fatal(err)
		}
	}
	type_("hello\n")
	if got := p.expect(t, "read"); got != "read hello" {
		t.Fatalf("command read %q", got)
	}

	type_("\x1a") // Ctrl-Z
	deadline := time.Now().Add(30 * time.Second)
	for procState(t, cmd.Process.Pid) != 'T' {
		if time.Now().After(deadline) {
			t.Fatalf("locker did not stop with its job on Ctrl-Z; stderr %s", p.stderr.String())
		}
		time.Sleep(time.Millisecond)
	}
	if isFree(t, url, "job") {
		t.Fatal("lock released on Ctrl-Z")
	}
	p.signal(t, syscall.SIGCONT) // fg
	type_("again\n")
	if got := p.expect(t, "read"); got != "read again" {
		t.Fatalf("command read %q after being continued", got)
	}

	type_("\x03") // Ctrl-C
	if got := p.expect(t, "got"); got != "got interrupt" {
		t.Fatalf("command said %q", got)
	}
	if code := p.wait(t); code != 7 {
		t.Fatalf("code %d, want the command's 7; stderr %s", code, p.stderr.String())
	}
	if !isFree(t, url, "job") {
		t.Fatal("lock held after the command exited")
	}
}

// holdFlock takes the flock of key's lock file, as a process stopped in the
// middle of an operation would hold it: renewals of the key fail until the
// returned function lets it go.
func holdFlock(t *testing.T, url, key string) (release func()) {
	t.Helper()
	l, err := locker.OpenURL(url)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	path := filepath.Join(strings.TrimPrefix(url, "file://"), fileNameOf(t, l, key))
	fd, err := unix.Open(path, unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Flock(fd, unix.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	release = func() { once.Do(func() { unix.Close(fd) }) }
	t.Cleanup(release)
	return release
}

// --on-lost kill and ignore, with renewals failing (the lock file's flock
// held by someone else): kill sends SIGKILL at the deadline and no
// SIGTERM; ignore sends nothing and lets the command run.
func TestRunOnLostModesAtDeadline(t *testing.T) {
	t.Run("kill", func(t *testing.T) {
		url := fileURL(t)
		pidfile := filepath.Join(t.TempDir(), "pid")
		p := start(t, nil, append([]string{"run", "--url", url, "--ttl", "1s", "--on-lost", "kill", "job", "--"}, inSh(child("trap", pidfile)...)...)...)
		p.expect(t, "ready")
		pid, err := readPid(pidfile)
		if err != nil {
			t.Fatal(err)
		}
		death := watchDeath(t, pid)
		held := mono()
		release := holdFlock(t, url, "job")
		died := awaitDeath(t, death, "the grandchild")
		release()
		if died-held < time.Second/3 {
			t.Errorf("killed %v after renewals started failing: before the deadline", died-held)
		}
		if code := p.wait(t); code != exitLost {
			t.Fatalf("code %d, want %d; stderr %s", code, exitLost, p.stderr.String())
		}
		for l := range p.lines {
			if strings.HasPrefix(l, "term") {
				t.Errorf("the job got SIGTERM with --on-lost kill")
			}
		}
		if !strings.Contains(p.stderr.String(), "(no renewal before its safe deadline); sending SIGKILL") {
			t.Fatalf("stderr: %s", p.stderr.String())
		}
	})
	t.Run("ignore", func(t *testing.T) {
		url := fileURL(t)
		p := start(t, nil, append([]string{"run", "--url", url, "--ttl", "1s", "--on-lost", "ignore", "job", "--"}, child("signals")...)...)
		p.expect(t, "ready")
		release := holdFlock(t, url, "job")
		waitStderr(t, p, `lock "job" lost while the command ran; letting it run (--on-lost=ignore)`)
		release()
		p.signal(t, syscall.SIGUSR1) // still running: it answers
		if got := p.expect(t, "got"); got != "got user defined signal 1" {
			t.Fatalf("command said %q", got)
		}
		p.signal(t, syscall.SIGTERM)
		if got := p.expect(t, "got"); got != "got terminated" {
			t.Fatalf("command said %q", got)
		}
		if code := p.wait(t); code != exitLost {
			t.Fatalf("code %d, want %d", code, exitLost)
		}
		if strings.Contains(p.stderr.String(), "SIG") {
			t.Fatalf("a signal was sent with --on-lost ignore: %s", p.stderr.String())
		}
	})
}

// A renewal that succeeds after SIGTERM went out (renewals failed to within
// --grace of the deadline, then recovered) keeps the lock: no SIGKILL, the
// lock stays held while the job runs, and is released when it ends; the
// exit code is still 123, since the job was told to stop.
func TestRunRenewalRecoversAfterTerm(t *testing.T) {
	url := fileURL(t)
	const ttl = time.Second
	pidfile := filepath.Join(t.TempDir(), "pid")
	p := start(t, nil, append([]string{"run", "--url", url, "--ttl", ttl.String(), "job", "--"}, child("trap", pidfile)...)...)
	tok := tokenOf(t, p.expect(t, "ready"))
	release := holdFlock(t, url, "job")
	p.expect(t, "term ")
	release()
	heldThroughout(t, url, "job", tok, 2*ttl) // renewed: held past the old deadline
	pid, err := readPid(pidfile)
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if code := p.wait(t); code != exitLost {
		t.Fatalf("code %d, want %d; stderr %s", code, exitLost, p.stderr.String())
	}
	if strings.Contains(p.stderr.String(), "sending SIGKILL") {
		t.Fatalf("SIGKILL sent although the lock was renewed: %s", p.stderr.String())
	}
	if !isFree(t, url, "job") {
		t.Fatal("lock held after the job ended")
	}
}
