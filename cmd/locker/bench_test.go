package main

import (
	"strconv"
	"strings"
	"testing"
)

func uitoa(u uint64) string { return strconv.FormatUint(u, 10) }

func TestBenchCommand(t *testing.T) {
	for _, url := range []string{fileURL(t), "mem://"} {
		code, out, stderr := run(t, nil, "bench", "--url", url, "--workers", "3", "--duration", "500ms", "--hold", "1ms")
		if code != 0 || stderr != "" {
			t.Fatalf("bench %s: code %d, stderr %q", url, code, stderr)
		}
		for _, want := range []string{"acquire", "handoff", "p50", "p99", "throughput", "violations  none (0 overlaps, 0 token regressions)", "errors      0"} {
			if !strings.Contains(out, want) {
				t.Errorf("bench %s output lacks %q:\n%s", url, want, out)
			}
		}
	}
}
