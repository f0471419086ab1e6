package main

import (
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/go-locker/locker/internal/redistest"
)

// A backend that cannot be reached is exit code 122 for every subcommand,
// apart from a key held by someone else (124 for run) and from usage errors
// (125).

// Nothing listens on the port: run, status and bench exit 122 with one
// line naming the cause, and run starts nothing. etcd's client retries a
// refused connection, so there the open's ping runs out (10s) instead.
func TestUnavailableRefused(t *testing.T) {
	p := strconv.Itoa(redistest.RefusedPort(t))
	for _, url := range []string{
		"redis://127.0.0.1:" + p,
		"rueidis://127.0.0.1:" + p,
		"postgres://postgres@127.0.0.1:" + p + "/postgres?sslmode=disable",
	} {
		for _, args := range [][]string{
			append([]string{"run", "--url", url, "job", "--"}, child("exit", "0")...),
			{"status", "--url", url, "job"},
			{"bench", "--url", url, "--duration", "100ms"},
		} {
			code, out, stderr := run(t, nil, args...)
			if code != exitUnavailable || out != "" {
				t.Errorf("%s %s: code %d, output %q; want %d and nothing run", args[0], url, code, out, exitUnavailable)
			}
			checkOneLine(t, stderr, "connection refused")
		}
	}
	code, out, stderr := run(t, nil, append([]string{"run", "--url", "etcd://127.0.0.1:" + p + "/locker-cmd-test", "job", "--"}, child("exit", "0")...)...)
	if code != exitUnavailable || out != "" {
		t.Errorf("etcd: code %d, output %q; want %d and nothing run", code, out, exitUnavailable)
	}
	checkOneLine(t, stderr, "not reachable within 10s")
}

// A real Redis server: while it runs, a held key is 124 (run --wait 0) and
// status shows the holder; once it is killed, run (--wait 0, and a run
// that was waiting when it died) and status exit 122.
func TestUnavailableServerKilled(t *testing.T) {
	s := redistest.Start(t)
	env := []string{"LOCKER_URL=" + s.URL()}
	holder := start(t, env, append([]string{"run", "--ttl", "5s", "job", "--"}, child("signals")...)...)
	holder.expect(t, "ready")
	code, _, stderr := run(t, env, append([]string{"run", "--wait", "0", "job", "--"}, child("exit", "0")...)...)
	if code != exitNotAcquired {
		t.Fatalf("held key: code %d, want %d; %s", code, exitNotAcquired, stderr)
	}
	checkOneLine(t, stderr, `"job" is held by another owner`)
	if code, _, stderr := run(t, env, "status", "job"); code != exitOK {
		t.Fatalf("status of a held key: code %d; %s", code, stderr)
	}
	waiter := start(t, env, append([]string{"run", "-v", "--wait", "2s", "job", "--"}, child("exit", "0")...)...)
	waitStderr(t, waiter, "waiting for")

	s.Kill()
	code, out, stderr := run(t, env, append([]string{"run", "--wait", "0", "job", "--"}, child("exit", "0")...)...)
	if code != exitUnavailable || out != "" {
		t.Errorf("run, server killed: code %d, output %q; want %d and nothing run", code, out, exitUnavailable)
	}
	checkOneLine(t, stderr, "connection refused")
	code, out, stderr = run(t, env, "status", "job")
	if code != exitUnavailable || out != "" {
		t.Errorf("status, server killed: code %d, output %q, stderr %q; want %d", code, out, stderr, exitUnavailable)
	}
	code, fields, _ := statusJSONOf(t, env, "job")
	if code != exitUnavailable {
		t.Errorf("status -o json, server killed: code %d, want %d", code, exitUnavailable)
	}
	checkFields(t, fields, map[string]any{"key": "job", "reachable": false, "error": nil})
	drain(waiter)
	if code := waiter.wait(t); code != exitUnavailable {
		t.Errorf("run waiting when the server died: code %d, want %d; stderr %s", code, exitUnavailable, waiter.stderr.String())
	}
	holder.signal(t, syscall.SIGTERM)
	drain(holder)
	holder.wait(t)
	if strings.Contains(waiter.stderr.String(), "still held") {
		t.Errorf("the waiter reported the key held: %s", waiter.stderr.String())
	}
}
