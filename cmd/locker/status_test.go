package main

import (
	"regexp"
	"syscall"
	"testing"
)

func TestStatus(t *testing.T) {
	url := fileURL(t)
	code, out, stderr := run(t, nil, "status", "--url", url, "job")
	if code != exitFree || out != `"job" is free` || stderr != "" {
		t.Fatalf("free key: code %d, %q, %q", code, out, stderr)
	}
	holder := start(t, nil, append([]string{"run", "--url", url, "--ttl", "1m", "job", "--"}, child("signals")...)...)
	tok := tokenOf(t, holder.expect(t, "ready"))
	code, out, stderr = run(t, []string{"LOCKER_URL=" + url}, "status", "job") // URL from the environment
	if code != exitOK || stderr != "" {
		t.Fatalf("held key: code %d, %q", code, stderr)
	}
	re := regexp.MustCompile(`^key      job\nholder   [0-9a-f]{32}\ntoken    (\d+)\nexpires  in \d+(\.\d+)?s$`)
	m := re.FindStringSubmatch(out)
	if m == nil || m[1] != uitoa(tok) {
		t.Fatalf("status output:\n%s\nwant token %d", out, tok)
	}
	holder.signal(t, syscall.SIGTERM)
	holder.wait(t)
}
