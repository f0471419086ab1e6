package main

import (
	"encoding/json"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/go-locker/locker/internal/redistest"
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

// statusJSONOf runs locker status -o json and decodes its one line into a
// map, so that the field names themselves are checked.
func statusJSONOf(t *testing.T, env []string, args ...string) (code int, fields map[string]any, stderr string) {
	t.Helper()
	code, out, stderr := run(t, env, append([]string{"status", "-o", "json"}, args...)...)
	if strings.Count(out, "\n") != 0 {
		t.Fatalf("status -o json printed more than one line: %q", out)
	}
	d := json.NewDecoder(strings.NewReader(out))
	d.UseNumber()
	if err := d.Decode(&fields); err != nil {
		t.Fatalf("status -o json: %v in %q (stderr %q)", err, out, stderr)
	}
	return code, fields, stderr
}

// checkFields checks that fields has exactly the names in want, with the
// values given (nil: any value).
func checkFields(t *testing.T, fields map[string]any, want map[string]any) {
	t.Helper()
	var got, wantNames []string
	for k := range fields {
		got = append(got, k)
	}
	for k := range want {
		wantNames = append(wantNames, k)
	}
	slices.Sort(got)
	slices.Sort(wantNames)
	if !slices.Equal(got, wantNames) {
		t.Errorf("fields %v, want %v: %v", got, wantNames, fields)
	}
	for k, v := range want {
		if v != nil && fields[k] != v {
			t.Errorf("%s = %#v, want %#v", k, fields[k], v)
		}
	}
}

func TestStatusJSON(t *testing.T) {
	url := fileURL(t)
	code, fields, stderr := statusJSONOf(t, nil, "--url", url, "job")
	if code != exitFree || stderr != "" {
		t.Fatalf("free key: code %d, stderr %q", code, stderr)
	}
	checkFields(t, fields, map[string]any{"key": "job", "reachable": true, "held": false})

	const ttl = time.Minute
	holder := start(t, nil, append([]string{"run", "--url", url, "--ttl", ttl.String(), "job", "--"}, child("signals")...)...)
	tok := tokenOf(t, holder.expect(t, "ready"))
	code, fields, stderr = statusJSONOf(t, nil, "job", "--url", url)
	if code != exitOK || stderr != "" {
		t.Fatalf("held key: code %d, stderr %q", code, stderr)
	}
	checkFields(t, fields, map[string]any{"key": "job", "reachable": true, "held": true,
		"holder": nil, "token": json.Number(uitoa(tok)), "remaining_ms": nil})
	if h, _ := fields["holder"].(string); !regexp.MustCompile(`^[0-9a-f]{32}$`).MatchString(h) {
		t.Errorf("holder %q, want the 32-hex-digit owner", h)
	}
	ms, err := fields["remaining_ms"].(json.Number).Int64()
	if err != nil || ms <= 0 || ms > ttl.Milliseconds() {
		t.Errorf("remaining_ms %v (%v), want in (0, %d]", fields["remaining_ms"], err, ttl.Milliseconds())
	}
	holder.signal(t, syscall.SIGTERM)
	holder.wait(t)

	// The backend down: still one JSON object, reachable false, exit 122.
	port := redistest.RefusedPort(t)
	code, fields, stderr = statusJSONOf(t, nil, "--url", "redis://127.0.0.1:"+strconv.Itoa(port), "job")
	if code != exitUnavailable {
		t.Errorf("backend down: code %d, want %d", code, exitUnavailable)
	}
	checkOneLine(t, stderr, "connection refused")
	checkFields(t, fields, map[string]any{"key": "job", "reachable": false, "error": nil})
	if e, _ := fields["error"].(string); !strings.Contains(e, "connection refused") {
		t.Errorf("error %q does not say why", e)
	}

	code, out, stderr := run(t, nil, "status", "-o", "yaml", "--url", url, "job")
	if code != exitUsage || out != "" {
		t.Errorf("-o yaml: code %d, output %q", code, out)
	}
	checkOneLine(t, stderr, "-o must be text or json")
}
