package main

import (
	"bytes"
	"strings"
	"testing"
)

// --limit below 1, above the maximum or not a number is a usage error
// (exit 125) before any I/O: the backend named here does not answer, and
// would make it exit 122.
func TestLimitBadInput(t *testing.T) {
	const url = "redis://127.0.0.1:1/0"
	for _, n := range []string{"0", "-1", "1025", "x"} {
		code, _, stderr := run(t, nil, append([]string{"run", "--url", url, "--limit", n, "job", "--"}, child("exit", "0")...)...)
		if code != exitUsage || !strings.Contains(stderr, "limit") {
			t.Errorf("run --limit %s: code %d, stderr %q; want %d naming --limit", n, code, stderr, exitUsage)
		}
		code, _, stderr = run(t, nil, "status", "--url", url, "--limit", n, "job")
		if code != exitUsage || !strings.Contains(stderr, "limit") {
			t.Errorf("status --limit %s: code %d, stderr %q; want %d naming --limit", n, code, stderr, exitUsage)
		}
	}
}

// locker run --limit takes a permit and runs the command with its token;
// status --limit lists the holders; a backend without semaphores is an
// error that says so.
func TestLimitRun(t *testing.T) {
	code, out, stderr := run(t, nil, append([]string{"run", "--url", "mem://", "--limit", "2", "job", "--"}, child("exit", "3")...)...)
	if code != 3 || !strings.HasPrefix(out, "ready token=") || strings.HasPrefix(out, "ready token= ") {
		t.Fatalf("run --limit 2 on mem: code %d, out %q, stderr %q", code, out, stderr)
	}
	code, out, stderr = run(t, nil, "status", "--url", "mem://", "--limit", "2", "job")
	if code != exitFree || out != `"job" is free (0 of 2 permits held)` {
		t.Fatalf("status --limit 2 on mem: code %d, out %q, stderr %q", code, out, stderr)
	}
	code, out, stderr = run(t, nil, append([]string{"run", "--url", fileURL(t), "--limit", "2", "job", "--"}, child("exit", "3")...)...)
	if code != 3 || !strings.HasPrefix(out, "ready token=") || strings.HasPrefix(out, "ready token= ") {
		t.Fatalf("run --limit 2 on file: code %d, out %q, stderr %q", code, out, stderr)
	}
	// test-no-exclusion (bench_test.go, registered in this process) has no
	// driver.SharedLocker.
	var so, se bytes.Buffer
	code = Main(append([]string{"run", "--url", "test-no-exclusion://", "--limit", "2", "job", "--"}, child("exit", "0")...), &so, &se)
	if code != exitUsage || !strings.Contains(se.String(), "ErrUnsupported") && !strings.Contains(se.String(), "unsupported") {
		t.Fatalf("run --limit on a backend without semaphores: code %d, stderr %q", code, se.String())
	}
}
