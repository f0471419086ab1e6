package main

import (
	"syscall"
	"testing"
	"time"
)

// Without --ttl the lock's TTL is 30s: the remaining TTL a holder reads
// right after the grant lies within 30s and above 30s less renewal slack.
func TestRunDefaultTTL(t *testing.T) {
	url := fileURL(t)
	p := start(t, nil, append([]string{"run", "--url", url, "job", "--"}, child("signals")...)...)
	tok := tokenOf(t, p.expect(t, "ready"))
	lowest, samples := heldThroughout(t, url, "job", tok, 300*time.Millisecond)
	t.Logf("lowest remaining TTL %v in %d samples", lowest, samples)
	if lowest > 30*time.Second || lowest < 25*time.Second {
		t.Errorf("remaining TTL %v without --ttl, want just under 30s", lowest)
	}
	p.signal(t, syscall.SIGTERM)
	if code := p.wait(t); code != 7 {
		t.Fatalf("code %d, want the command's 7; stderr %s", code, p.stderr.String())
	}
}
