package main

import (
	"bytes"
	"context"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/driver"
	"github.com/go-locker/locker/drivers/mem"
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

// Deliberately broken drivers, registered for the in-process runs of
// `locker bench` below.
func init() {
	locker.Register("test-no-exclusion", noExclusion{})
	locker.Register("test-repeated-token", repeatedToken{})
}

// noExclusion grants every Acquire, with increasing tokens: holders overlap.
type noExclusion struct{}

var noExclusionTokens atomic.Uint64

func (noExclusion) Open(string) (driver.Locker, error) { return noExclusion{}, nil }
func (noExclusion) Acquire(context.Context, string, string, time.Duration) (uint64, error) {
	return noExclusionTokens.Add(1), nil
}
func (noExclusion) Refresh(context.Context, string, string, time.Duration) error { return nil }
func (noExclusion) Release(context.Context, string, string) error                { return nil }
func (noExclusion) Close() error                                                 { return nil }

// repeatedToken excludes correctly (the mem driver) but every grant has
// token 1.
type repeatedToken struct{ driver.Locker }

func (repeatedToken) Open(string) (driver.Locker, error) {
	d, err := mem.Driver{}.Open("mem://test-repeated-token")
	return repeatedToken{d}, err
}

func (r repeatedToken) Acquire(ctx context.Context, key, owner string, ttl time.Duration) (uint64, error) {
	_, err := r.Locker.Acquire(ctx, key, owner, ttl)
	return 1, err
}

// `locker bench` reports the violations it sees and exits 1: overlapping
// holders on a driver without mutual exclusion, token regressions on one
// whose tokens repeat.
func TestBenchReportsViolations(t *testing.T) {
	for _, tc := range []struct {
		url      string
		overlaps bool
	}{
		{"test-no-exclusion://", true},
		{"test-repeated-token://", false},
	} {
		var stdout, stderr bytes.Buffer
		code := Main([]string{"bench", "--url", tc.url, "--workers", "3", "--duration", "300ms", "--hold", "2ms"}, &stdout, &stderr)
		if code != exitFree {
			t.Errorf("%s: code %d, want %d; stdout:\n%s", tc.url, code, exitFree, stdout.String())
		}
		m := regexp.MustCompile(`violations  (\d+) overlaps, (\d+) token regressions\n`).FindStringSubmatch(stdout.String())
		if m == nil {
			t.Fatalf("%s: no violations line:\n%s", tc.url, stdout.String())
		}
		overlaps, regressions := m[1] != "0", m[2] != "0"
		if overlaps != tc.overlaps || !tc.overlaps && !regressions {
			t.Errorf("%s: %s overlaps, %s token regressions reported", tc.url, m[1], m[2])
		}
		checkOneLine(t, stderr.String(), "bench: mutual exclusion violated: "+m[1]+" overlaps, "+m[2]+" token regressions")
	}
}
