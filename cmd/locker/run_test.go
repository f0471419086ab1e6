package main

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/go-locker/locker"
	_ "github.com/go-locker/locker/drivers/file"
	"golang.org/x/sys/unix"
)

// isFree checks through the command that key is free on url.
func isFree(t *testing.T, url, key string) bool {
	t.Helper()
	code, _, stderr := run(t, nil, "status", "--url", url, key)
	if code != exitOK && code != exitFree {
		t.Fatalf("status: code %d, %s", code, stderr)
	}
	return code == exitFree
}

func TestRunExitCodeAndEnvironment(t *testing.T) {
	url := fileURL(t)
	for _, want := range []int{0, 3, 42} {
		code, out, stderr := run(t, nil, append([]string{"run", "--url", url, "job", "--"}, child("exit", strconv.Itoa(want))...)...)
		if code != want {
			t.Fatalf("exit code %d, want the command's %d; stderr: %s", code, want, stderr)
		}
		if !strings.HasPrefix(out, "ready token=") || !strings.Contains(out, " key=job") {
			t.Fatalf("command output %q: no LOCKER_TOKEN / LOCKER_KEY", out)
		}
		if stderr != "" {
			t.Fatalf("not quiet by default: %q", stderr)
		}
		if !isFree(t, url, "job") {
			t.Fatal("lock still held after the command exited")
		}
	}
}

func TestRunVerbose(t *testing.T) {
	url := fileURL(t)
	code, _, stderr := run(t, nil, append([]string{"run", "-v", "--url", url, "job", "--"}, child("exit", "0")...)...)
	if code != 0 {
		t.Fatalf("code %d: %s", code, stderr)
	}
	for _, want := range []string{"acquired \"job\": token", "started", "exited with code 0", "released \"job\""} {
		if !strings.Contains(stderr, want) {
			t.Errorf("-v output lacks %q:\n%s", want, stderr)
		}
	}
}

// The default backend is the file driver in the default directory: no URL
// needed. TMPDIR points it at a directory of this test.
func TestRunDefaultURL(t *testing.T) {
	env := []string{"TMPDIR=" + t.TempDir(), "LOCKER_URL="}
	holder := start(t, env, append([]string{"run", "nightly", "--"}, child("signals")...)...)
	holder.expect(t, "ready")
	code, _, stderr := run(t, env, append([]string{"run", "--wait", "0", "nightly", "--"}, child("exit", "0")...)...)
	if code != exitNotAcquired {
		t.Fatalf("second run on the default backend: code %d (%s), want %d", code, stderr, exitNotAcquired)
	}
	holder.signal(t, syscall.SIGTERM)
	if code := holder.wait(t); code != 7 {
		t.Fatalf("holder exit code %d", code)
	}
}

// Concurrent `locker run`s on one key never overlap: each command records
// its start and end, and the log must show them one after another, with
// increasing tokens.
func TestRunMutualExclusion(t *testing.T) {
	url := fileURL(t)
	checkMutualExclusion(t, url, 4)
}

// checkMutualExclusion runs n `locker run`s of one recording command on one
// key at once, against url, and checks from the log that the commands ran
// one after another with strictly increasing tokens.
func checkMutualExclusion(t *testing.T, url string, n int) {
	t.Helper()
	log := filepath.Join(t.TempDir(), "log")
	var ps []*proc
	for range n {
		ps = append(ps, start(t, nil, append([]string{"run", "--url", url, "--ttl", "5s", "job", "--"}, child("record", log, "50ms")...)...))
	}
	for _, p := range ps {
		drain(p)
		if code := p.wait(t); code != 0 {
			t.Fatalf("locker run: code %d, stderr %s", code, p.stderr.String())
		}
	}
	b, err := os.ReadFile(log)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) != 2*n {
		t.Fatalf("log has %d lines, want %d:\n%s", len(lines), 2*n, b)
	}
	var last uint64
	for i := 0; i < len(lines); i += 2 {
		s, e := strings.Fields(lines[i]), strings.Fields(lines[i+1])
		if s[0] != "start" || e[0] != "end" || s[1] != e[1] {
			t.Fatalf("commands overlapped:\n%s", b)
		}
		tok, _ := strconv.ParseUint(s[1], 10, 64)
		if tok <= last {
			t.Fatalf("token %d after %d:\n%s", tok, last, b)
		}
		last = tok
	}
}

func TestRunWait(t *testing.T) {
	url := fileURL(t)
	holder := start(t, nil, append([]string{"run", "--url", url, "job", "--"}, child("signals")...)...)
	holder.expect(t, "ready")

	// --wait 0: one attempt.
	begin := time.Now()
	code, out, stderr := run(t, nil, append([]string{"run", "--url", url, "--wait", "0", "job", "--"}, child("exit", "0")...)...)
	if code != exitNotAcquired || out != "" {
		t.Fatalf("--wait 0 on a held key: code %d, output %q; want %d and no command run", code, out, exitNotAcquired)
	}
	checkOneLine(t, stderr, `"job" is held by another owner`)
	if el := time.Since(begin); el > 30*time.Second {
		t.Fatalf("--wait 0 took %v", el)
	}

	// --wait D: gives up after D.
	begin = time.Now()
	code, out, stderr = run(t, nil, append([]string{"run", "--url", url, "--wait", "300ms", "job", "--"}, child("exit", "0")...)...)
	if code != exitNotAcquired || out != "" {
		t.Fatalf("--wait 300ms on a held key: code %d, output %q", code, out)
	}
	checkOneLine(t, stderr, `"job" is still held after waiting 300ms`)
	if el := time.Since(begin); el < 300*time.Millisecond {
		t.Fatalf("gave up after %v, before --wait 300ms", el)
	}

	// Without --wait: waits, and runs once the holder is done.
	waiter := start(t, nil, append([]string{"run", "--url", url, "job", "--"}, child("exit", "5")...)...)
	holder.signal(t, syscall.SIGTERM)
	if code := holder.wait(t); code != 7 {
		t.Fatalf("holder: code %d, stderr %s", code, holder.stderr.String())
	}
	tok := tokenOf(t, waiter.expect(t, "ready"))
	if code := waiter.wait(t); code != 5 {
		t.Fatalf("waiter: code %d, stderr %s", code, waiter.stderr.String())
	}
	if tok == 0 {
		t.Fatal("no token")
	}
}

// A holder that crashed (SIGKILL: no release) is taken over after its TTL.
func TestRunTakesOverCrashedHolder(t *testing.T) {
	url := fileURL(t)
	holder := start(t, nil, append([]string{"run", "--url", url, "--ttl", "500ms", "job", "--"}, child("stubborn")...)...)
	holder.expect(t, "ready")
	killed := time.Now()
	holder.signal(t, syscall.SIGKILL) // the command lives on, orphaned; the lock is not released
	holder.wait(t)
	code, _, stderr := run(t, nil, append([]string{"run", "--url", url, "--wait", "30s", "job", "--"}, child("exit", "0")...)...)
	if code != 0 {
		t.Fatalf("take-over: code %d, %s", code, stderr)
	}
	if el := time.Since(killed); el > 20*time.Second {
		t.Fatalf("take-over took %v", el)
	}
}

// killOrphans ends the test's commands that outlived their locker (a killed
// locker, or a group member it was not asked to wait for).
func killOrphans(t testing.TB) {
	t.Helper()
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		env, err := os.ReadFile("/proc/" + e.Name() + "/environ")
		vars := strings.Split(string(env), "\x00")
		if err == nil && slices.ContainsFunc(vars, func(v string) bool { return strings.HasPrefix(v, "LOCKER_TEST_CHILD=") }) &&
			slices.Contains(vars, "LOCKER_TEST_PARENT="+strconv.Itoa(os.Getpid())) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}

// steal takes key from its holder as another process would after the
// holder's lease ended: it removes the lock file and acquires key.
func steal(t *testing.T, url, key string) {
	t.Helper()
	l, err := locker.OpenURL(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	path := filepath.Join(strings.TrimPrefix(url, "file://"), fileNameOf(t, l, key))
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := l.TryAcquire(ctx, key); err != nil {
		t.Fatal(err)
	}
}

func fileNameOf(t *testing.T, l *locker.Locker, key string) string {
	t.Helper()
	p, ok := l.Driver().(interface{ Path(string) string })
	if !ok {
		t.Fatal("not the file driver")
	}
	return filepath.Base(p.Path(key))
}

// A lock the backend says is gone (another process removed the lock file
// and took the key) is lost before its deadline: another owner may hold it
// already, so the group gets SIGKILL at once, with --on-lost term too.
func TestRunLockLost(t *testing.T) {
	for _, tc := range []struct {
		name, onLost, mode string
	}{
		{"term", "term", "signals"},
		{"term-stubborn", "term", "stubborn"},
		{"kill", "kill", "stubborn"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			url := fileURL(t)
			p := start(t, nil, append([]string{"run", "--url", url, "--ttl", "600ms", "--on-lost", tc.onLost, "job", "--"}, child(tc.mode)...)...)
			p.expect(t, "ready")
			steal(t, url, "job")
			drain(p)
			if code := p.wait(t); code != exitLost {
				t.Fatalf("code %d, want %d (lost); stderr: %s", code, exitLost, p.stderr.String())
			}
			want := `lock "job" lost while the command ran (the backend says it is gone; another owner may hold it); sending SIGKILL to the command's process group`
			if !strings.Contains(p.stderr.String(), want) || strings.Contains(p.stderr.String(), "SIGTERM") {
				t.Fatalf("stderr: %s", p.stderr.String())
			}
		})
	}
	t.Run("ignore", func(t *testing.T) {
		url := fileURL(t)
		p := start(t, nil, append([]string{"run", "--url", url, "--ttl", "600ms", "--on-lost", "ignore", "job", "--"}, child("signals")...)...)
		p.expect(t, "ready")
		steal(t, url, "job")
		deadline := time.Now().Add(30 * time.Second)
		for !strings.Contains(p.stderr.String(), "letting it run") {
			if time.Now().After(deadline) {
				t.Fatalf("loss not reported: %s", p.stderr.String())
			}
			time.Sleep(5 * time.Millisecond)
		}
		p.signal(t, syscall.SIGUSR1) // still running: it answers
		if got := p.expect(t, "got"); got != "got user defined signal 1" {
			t.Fatalf("command said %q", got)
		}
		p.signal(t, syscall.SIGTERM)
		drain(p)
		if code := p.wait(t); code != exitLost {
			t.Fatalf("code %d, want %d", code, exitLost)
		}
	})
}

// A locker that is paused past its TTL (SIGSTOP: its renewer cannot run)
// loses the lock to a waiter; when it resumes it stops the command and says
// the lock was lost.
func TestRunLostWhilePaused(t *testing.T) {
	url := fileURL(t)
	p := start(t, nil, append([]string{"run", "--url", url, "--ttl", "500ms", "job", "--"}, child("signals")...)...)
	p.expect(t, "ready")
	p.signal(t, syscall.SIGSTOP)
	// Another process takes the key once the paused holder's lease ends.
	code, _, stderr := run(t, nil, append([]string{"run", "--url", url, "--wait", "30s", "job", "--"}, child("exit", "0")...)...)
	if code != 0 {
		t.Fatalf("taking the key from a paused holder: code %d, %s", code, stderr)
	}
	p.signal(t, syscall.SIGCONT)
	drain(p)
	if code := p.wait(t); code != exitLost {
		t.Fatalf("resumed holder: code %d, want %d; stderr: %s", code, exitLost, p.stderr.String())
	}
}

// A command killed by signal N makes locker exit with 128+N, as a shell
// reports it, and releases the lock.
func TestRunCommandKilledBySignal(t *testing.T) {
	url := fileURL(t)
	for _, sig := range []syscall.Signal{syscall.SIGKILL, syscall.SIGTERM, syscall.SIGUSR1} {
		code, _, stderr := run(t, nil, "run", "--url", url, "job", "--", "sh", "-c", "kill -s "+strings.TrimPrefix(unix.SignalName(sig), "SIG")+" $$")
		if code != 128+int(sig) {
			t.Errorf("command killed by %v: code %d, want %d; stderr %q", sig, code, 128+int(sig), stderr)
		}
		if !isFree(t, url, "job") {
			t.Fatalf("lock held after the command was killed by %v", sig)
		}
	}
}

func TestRunForwardsSignals(t *testing.T) {
	url := fileURL(t)
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGINT} {
		p := start(t, nil, append([]string{"run", "--url", url, "job", "--"}, child("signals")...)...)
		p.expect(t, "ready")
		p.signal(t, syscall.SIGUSR1)
		if got := p.expect(t, "got"); got != "got user defined signal 1" {
			t.Fatalf("command said %q", got)
		}
		p.signal(t, syscall.SIGHUP)
		if got := p.expect(t, "got"); got != "got hangup" {
			t.Fatalf("command said %q", got)
		}
		p.signal(t, sig)
		if got := p.expect(t, "got"); got != "got "+sig.String() {
			t.Fatalf("command said %q, want got %v", got, sig)
		}
		if code := p.wait(t); code != 7 {
			t.Fatalf("code %d, want the command's 7; stderr %s", code, p.stderr.String())
		}
		if !isFree(t, url, "job") {
			t.Fatalf("lock not released after %v", sig)
		}
	}
}

// A signal while waiting for the lock ends the wait (128+N) and leaves
// nothing held.
func TestRunSignalWhileWaiting(t *testing.T) {
	url := fileURL(t)
	holder := start(t, nil, append([]string{"run", "--url", url, "job", "--"}, child("signals")...)...)
	holder.expect(t, "ready")
	waiter := start(t, nil, append([]string{"run", "-v", "--url", url, "job", "--"}, child("exit", "0")...)...)
	deadline := time.Now().Add(30 * time.Second)
	for !strings.Contains(waiter.stderr.String(), "waiting for") {
		if time.Now().After(deadline) {
			t.Fatalf("waiter never waited: %s", waiter.stderr.String())
		}
		time.Sleep(5 * time.Millisecond)
	}
	waiter.signal(t, syscall.SIGTERM)
	drain(waiter)
	if code := waiter.wait(t); code != 128+int(syscall.SIGTERM) {
		t.Fatalf("waiter: code %d; stderr %s", code, waiter.stderr.String())
	}
	holder.signal(t, syscall.SIGTERM)
	if code := holder.wait(t); code != 7 {
		t.Fatalf("holder: code %d", code)
	}
	if !isFree(t, url, "job") {
		t.Fatal("lock held after both exited")
	}
}

func TestRunBadInput(t *testing.T) {
	dir := t.TempDir()
	url := "file://" + dir
	plain := filepath.Join(t.TempDir(), "plain")
	if err := os.WriteFile(plain, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	noexec := filepath.Join(t.TempDir(), "noexec")
	if err := os.WriteFile(noexec, []byte("#!/bin/sh\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		args []string
		code int
		want string
	}{
		{"missing --", []string{"run", "--url", url, "job", "true"}, exitUsage, "missing -- between KEY and COMMAND"},
		{"missing key", []string{"run", "--url", url}, exitUsage, "missing KEY"},
		{"empty key", []string{"run", "--url", url, "", "--", "true"}, exitUsage, "empty KEY"},
		{"missing command", []string{"run", "--url", url, "job", "--"}, exitUsage, "missing COMMAND"},
		{"negative ttl", []string{"run", "--url", url, "--ttl", "-1s", "job", "--", "true"}, exitUsage, "--ttl must be positive"},
		{"zero ttl", []string{"run", "--url", url, "--ttl", "0", "job", "--", "true"}, exitUsage, "--ttl must be positive"},
		{"bad ttl", []string{"run", "--url", url, "--ttl", "soon", "job", "--", "true"}, exitUsage, "invalid value \"soon\" for flag -ttl"},
		{"negative wait", []string{"run", "--url", url, "--wait", "-1s", "job", "--", "true"}, exitUsage, "must not be negative"},
		{"bad on-lost", []string{"run", "--url", url, "--on-lost", "panic", "job", "--", "true"}, exitUsage, "--on-lost must be term, kill or ignore"},
		{"negative grace", []string{"run", "--url", url, "--grace", "-1s", "job", "--", "true"}, exitUsage, "--grace must not be negative"},
		{"bad grace", []string{"run", "--url", url, "--grace", "soon", "job", "--", "true"}, exitUsage, "invalid value \"soon\" for flag -grace"},
		{"grace too long", []string{"run", "--url", url, "--ttl", "3s", "--grace", "1500ms", "job", "--", "true"}, exitUsage, "--grace 1.5s does not fit --ttl 3s"},
		{"grace too long for the default ttl", []string{"run", "--url", url, "--grace", "15s", "job", "--", "true"}, exitUsage, "--grace 15s does not fit --ttl 30s"},
		{"negative max-hold", []string{"run", "--url", url, "--max-hold", "-1s", "job", "--", "true"}, exitUsage, "--max-hold must not be negative"},
		{"negative min-hold", []string{"run", "--url", url, "--min-hold", "-1s", "job", "--", "true"}, exitUsage, "--min-hold must not be negative"},
		{"min-hold over max-hold", []string{"run", "--url", url, "--max-hold", "1s", "--min-hold", "2s", "job", "--", "true"}, exitUsage, "--min-hold 2s is longer than --max-hold 1s"},
		{"bad max-hold", []string{"run", "--url", url, "--max-hold", "soon", "job", "--", "true"}, exitUsage, "invalid value \"soon\" for flag -max-hold"},
		{"bad min-hold", []string{"run", "--url", url, "job", "--min-hold", "1 hour", "--", "true"}, exitUsage, "invalid value \"1 hour\" for flag -min-hold"},
		{"unknown flag", []string{"run", "--url", url, "--frobnicate", "job", "--", "true"}, exitUsage, "flag provided but not defined: -frobnicate"},
		{"flag after key", []string{"run", "--url", url, "job", "--ttl", "-5s", "--", "true"}, exitUsage, "--ttl must be positive"},
		{"command not found", []string{"run", "--url", url, "job", "--", "no-such-command-xyz"}, exitNotFound, `command "no-such-command-xyz": executable file not found`},
		{"command path not found", []string{"run", "--url", url, "job", "--", "/no/such/command"}, exitNotFound, `command "/no/such/command": no such file or directory`},
		{"command not executable", []string{"run", "--url", url, "job", "--", noexec}, exitCannotRun, "permission denied"},
		{"unknown scheme", []string{"run", "--url", "nosuch://x", "job", "--", "true"}, exitUsage, `unknown driver "nosuch"`},
		{"malformed url", []string{"run", "--url", "://x", "job", "--", "true"}, exitUsage, "malformed URL"},
		{"unknown parameter", []string{"run", "--url", url + "?color=red", "job", "--", "true"}, exitUsage, `unknown query parameter "color"`},
		{"unreachable url", []string{"run", "--url", "file://" + plain + "/sub", "job", "--", "true"}, exitUsage, "not a directory"},
		{"unknown command", []string{"frobnicate"}, exitUsage, `unknown command "frobnicate"`},
		{"status without key", []string{"status", "--url", url}, exitUsage, "want exactly one KEY"},
		{"status empty key", []string{"status", "--url", url, ""}, exitUsage, "empty KEY"},
		{"status unknown scheme", []string{"status", "--url", "nosuch://", "job"}, exitUsage, `unknown driver "nosuch"`},
		{"bench workers", []string{"bench", "--url", url, "--workers", "0"}, exitUsage, "--workers must be at least 1"},
		{"bench duration", []string{"bench", "--url", url, "--duration", "-1s"}, exitUsage, "--duration must be positive"},
		{"bench argument", []string{"bench", "--url", url, "extra"}, exitUsage, `unexpected argument "extra"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, out, stderr := run(t, nil, tc.args...)
			if code != tc.code {
				t.Errorf("code %d, want %d; stderr %q", code, tc.code, stderr)
			}
			if out != "" {
				t.Errorf("stdout %q", out)
			}
			checkOneLine(t, stderr, tc.want)
		})
	}
	// Nothing was left behind: no lock files in the directory.
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if e.Name() != "tokens" {
			t.Errorf("left behind: %s", e.Name())
		}
	}
}

func TestHelp(t *testing.T) {
	code, out, _ := run(t, nil, "run", "-h")
	if code != 0 || !strings.Contains(out, "-on-lost") {
		t.Fatalf("run -h: code %d, %q", code, out)
	}
	code, out, _ = run(t, nil, "help")
	if code != 0 || !strings.Contains(out, "124 lock not acquired") {
		t.Fatalf("help: code %d, %q", code, out)
	}
	code, _, stderr := run(t, nil)
	if code != exitUsage || !strings.Contains(stderr, "usage:") {
		t.Fatalf("no arguments: code %d, %q", code, stderr)
	}
	code, out, _ = run(t, nil, "drivers")
	if code != 0 || !strings.Contains(out, "file") || !strings.Contains(out, "mem") {
		t.Fatalf("drivers: code %d, %q", code, out)
	}
}

// heldThroughout samples key on url every 5ms for d, fails the test unless
// it is held with token throughout, and returns the lowest remaining TTL
// seen and the number of samples.
func heldThroughout(t *testing.T, url, key string, token uint64, d time.Duration) (lowest time.Duration, samples int) {
	t.Helper()
	l, err := locker.OpenURL(url)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	ctx, cancel := context.WithTimeout(context.Background(), d+time.Minute)
	defer cancel()
	lowest = time.Duration(1<<63 - 1)
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(5 * time.Millisecond) {
		in, err := l.Inspect(ctx, key)
		if err != nil || in.Token != token {
			t.Fatalf("after %d samples: %+v, %v; want %q held with token %d", samples, in, err, key, token)
		}
		lowest = min(lowest, in.Remaining)
		samples++
	}
	return lowest, samples
}

// `locker run` renews the lock every TTL/3 while the command runs: sampled
// for 3 TTLs, the lock's remaining TTL never falls below 2/3 of the TTL by
// more than 200ms of scheduling (renewing every TTL/2 would let it fall to
// TTL/2, and not renewing would lose the lock).
func TestRunRenewsEveryThirdOfTTL(t *testing.T) {
	url := fileURL(t)
	const ttl = 1500 * time.Millisecond
	p := start(t, nil, append([]string{"run", "--url", url, "--ttl", ttl.String(), "job", "--"}, child("signals")...)...)
	tok := tokenOf(t, p.expect(t, "ready"))
	lowest, samples := heldThroughout(t, url, "job", tok, 3*ttl)
	t.Logf("lowest remaining TTL %v in %d samples", lowest, samples)
	if lowest < 2*ttl/3-200*time.Millisecond {
		t.Errorf("remaining TTL fell to %v: not renewed every TTL/3 (%v)", lowest, ttl/3)
	}
	p.signal(t, syscall.SIGTERM)
	if code := p.wait(t); code != 7 {
		t.Fatalf("code %d, want the command's 7; stderr %s", code, p.stderr.String())
	}
}
