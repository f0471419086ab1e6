package main

import (
	"context"
	"encoding/json"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/internal/redistest"
)

// locker run --elect with a flag that does not apply to an election
// (--min-hold, --wait, --limit; before or after KEY) is a usage error
// (125) with one line naming the flag, before any I/O: the backend named
// here refuses connections, which would be 122, and the command never
// runs.
func TestRunElectUsage(t *testing.T) {
	url := "redis://127.0.0.1:" + strconv.Itoa(redistest.RefusedPort(t))
	cmd := child("exit", "0")
	for flag, args := range map[string][]string{
		"--min-hold":         {"--min-hold", "1s", "--elect", "v", "e", "--"},
		"--wait":             {"--elect", "v", "--wait", "0", "e", "--"},
		"--wait forever":     {"--elect", "v", "--wait", "forever", "e", "--"},
		"--wait after KEY":   {"--elect", "v", "e", "--wait", "5s", "--"},
		"--limit":            {"--elect", "v", "--limit", "2", "e", "--"},
		"--limit after KEY":  {"--elect", "v", "e", "--limit", "1", "--"},
		"--min-hold and ttl": {"--elect", "v", "--ttl", "5s", "e", "--min-hold", "2s", "--"},
	} {
		name := strings.Fields(flag)[0]
		code, out, stderr := run(t, nil, append(append([]string{"run", "--url", url}, args...), cmd...)...)
		if code != exitUsage || out != "" {
			t.Errorf("run %s with --elect: code %d, output %q; want %d and nothing run", flag, code, out, exitUsage)
		}
		checkOneLine(t, stderr, name+" does not apply with --elect")
	}
	// Without those flags the same command reaches the backend: 122.
	code, out, stderr := run(t, nil, append([]string{"run", "--url", url, "--elect", "v", "e", "--"}, cmd...)...)
	if code != exitUnavailable || out != "" {
		t.Errorf("run --elect on a refused backend: code %d, output %q, stderr %q; want %d", code, out, stderr, exitUnavailable)
	}
}

// A terminating signal N while locker run --elect campaigns (another
// candidate leads) ends it with 128+N, one line saying so, the command never
// started and the leader untouched.
func TestRunElectSignalWhileCampaigning(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	url := fileURL(t)
	l, err := locker.OpenURL(url)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	lk, err := l.Election("e").Campaign(ctx, "leader")
	if err != nil {
		t.Fatal(err)
	}
	defer lk.Release(ctx)
	for _, sig := range []syscall.Signal{syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT} {
		p := start(t, []string{"LOCKER_URL=" + url}, append([]string{"run", "-v", "--elect", "b", "e", "--"}, child("exit", "0")...)...)
		// Signals are caught from before the open; once it is logged the
		// candidate is campaigning (or about to).
		waitStderr(t, p, "opened")
		p.signal(t, sig)
		var out []string
		for line := range p.lines {
			out = append(out, line)
		}
		code := p.wait(t)
		if code != 128+int(sig) || len(out) != 0 {
			t.Errorf("%v while campaigning: code %d, output %q; want %d and nothing run", sig, code, out, 128+int(sig))
		}
		if !strings.Contains(p.stderr.String(), "while campaigning") {
			t.Errorf("%v while campaigning: stderr %q; want a line saying so", sig, p.stderr.String())
		}
		ld, err := l.Election("e").Leader(ctx)
		if err != nil || ld.Value != "leader" || ld.Term != lk.Token() {
			t.Fatalf("leader after the candidate exited: %+v, %v", ld, err)
		}
	}
}

// locker leader KEY: 0 and the leader when someone leads, 1 when nobody
// does (text and JSON), 122 when the backend is unreachable, 125 on bad
// usage (before any I/O: on the unreachable backend it would be 122).
func TestLeaderExitCodes(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	url := fileURL(t)
	env := []string{"LOCKER_URL=" + url}
	code, out, stderr := run(t, env, "leader", "e")
	if code != exitFree || out != `"e" has no leader` || stderr != "" {
		t.Errorf("nobody leads: code %d, out %q, stderr %q; want %d", code, out, stderr, exitFree)
	}
	code, out, _ = run(t, env, "leader", "-o", "json", "e")
	var js leaderJSON
	if err := json.Unmarshal([]byte(out), &js); err != nil || code != exitFree || js.Leader == nil || *js.Leader || js.Election != "e" {
		t.Errorf("nobody leads, json: code %d, out %q (%v); want %d, leader false", code, out, err, exitFree)
	}
	l, err := locker.OpenURL(url)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	lk, err := l.Election("e").Campaign(ctx, "me:1", locker.WithTTL(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer lk.Release(ctx)
	code, out, stderr = run(t, env, "leader", "e")
	term := strconv.FormatUint(lk.Token(), 10)
	if code != exitOK || !strings.Contains(out, "leader   me:1\n") || !strings.Contains(out, "term     "+term+"\n") {
		t.Errorf("someone leads: code %d, out %q, stderr %q; want %d, me:1, term %s", code, out, stderr, exitOK, term)
	}
	code, out, _ = run(t, env, "leader", "e", "-o", "json")
	js = leaderJSON{}
	if err := json.Unmarshal([]byte(out), &js); err != nil || code != exitOK || js.Leader == nil || !*js.Leader ||
		js.Value == nil || *js.Value != "me:1" || js.Term == nil || *js.Term != lk.Token() || js.RemainingMS == nil || *js.RemainingMS <= 0 {
		t.Errorf("someone leads, json: code %d, out %q (%v)", code, out, err)
	}

	refused := "redis://127.0.0.1:" + strconv.Itoa(redistest.RefusedPort(t))
	code, out, stderr = run(t, nil, "leader", "--url", refused, "e")
	if code != exitUnavailable || out != "" {
		t.Errorf("unreachable: code %d, out %q; want %d", code, out, exitUnavailable)
	}
	checkOneLine(t, stderr, "connection refused")
	code, out, _ = run(t, nil, "leader", "--url", refused, "-o", "json", "e")
	js = leaderJSON{}
	if err := json.Unmarshal([]byte(out), &js); err != nil || code != exitUnavailable || js.Leader != nil || js.Error == "" {
		t.Errorf("unreachable, json: code %d, out %q (%v); want %d and an error", code, out, err, exitUnavailable)
	}

	for _, args := range [][]string{
		{},         // no KEY
		{"a", "b"}, // two
		{""},       // empty
		{"-o", "yaml", "e"},
		{"--nope", "e"},
	} {
		code, out, stderr := run(t, nil, append([]string{"leader", "--url", refused}, args...)...)
		if code != exitUsage || out != "" {
			t.Errorf("leader %q: code %d, out %q; want %d", args, code, out, exitUsage)
		}
		checkOneLine(t, stderr, "leader: ")
	}
}

// locker leader --watch prints the leader (or nobody) and every change,
// and exits 0 when interrupted (SIGINT, SIGTERM, SIGHUP).
func TestLeaderWatchInterrupted(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	url := fileURL(t)
	env := []string{"LOCKER_URL=" + url}
	l, err := locker.OpenURL(url)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	for _, sig := range []syscall.Signal{syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP} {
		p := start(t, env, "leader", "--watch", "e")
		p.expect(t, `"e" has no leader`)
		lk, err := l.Election("e").Campaign(ctx, "w")
		if err != nil {
			t.Fatal(err)
		}
		line := p.expect(t, "term ")
		if want := "term " + strconv.FormatUint(lk.Token(), 10) + `: "w" leads`; !strings.HasPrefix(line, want) {
			t.Errorf("watch: %q, want %q", line, want)
		}
		p.signal(t, sig)
		if code := p.wait(t); code != exitOK {
			t.Errorf("leader --watch interrupted by %v: code %d, stderr %q; want 0", sig, code, p.stderr.String())
		}
		if s := p.stderr.String(); s != "" {
			t.Errorf("leader --watch interrupted by %v: stderr %q", sig, s)
		}
		if err := lk.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
}
