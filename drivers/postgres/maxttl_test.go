package postgres

import (
	"errors"
	"testing"
	"time"

	"github.com/go-locker/locker/driver"
)

// TTLs are whole milliseconds from 10ms to MaxTTL: the advisory mode
// reports that minimum and granularity, and both modes refuse a TTL above
// MaxTTL with ErrInvalid, holding nothing, while MaxTTL itself is granted.
func TestTTLLimits(t *testing.T) {
	url := serverURL(t)
	adv := openT(t, url)
	c := adv.Capabilities()
	if c.MinTTL != 10*time.Millisecond || c.TTLGranularity != time.Millisecond {
		t.Fatalf("advisory capabilities %+v, want MinTTL 10ms and granularity 1ms", c)
	}
	if MaxTTL < 24*24*time.Hour || MaxTTL > 25*24*time.Hour {
		t.Fatalf("MaxTTL = %v, want about 24.8 days", MaxTTL)
	}
	ctx := ctxFor(t, 30*time.Second)
	for name, l := range map[string]driver.Locker{"advisory": adv, "lease": openLeaseT(t, url)} {
		key := "maxttl/" + name + "/" + time.Now().Format(time.RFC3339Nano)
		if _, err := l.Acquire(ctx, key, "a", MaxTTL+time.Millisecond); !errors.Is(err, driver.ErrInvalid) {
			t.Fatalf("%s: Acquire with MaxTTL + 1ms: %v, want ErrInvalid", name, err)
		}
		if _, err := l.Acquire(ctx, key, "b", time.Second); err != nil {
			t.Fatalf("%s: the refused Acquire left the key held: %v", name, err)
		}
		if err := l.Refresh(ctx, key, "b", MaxTTL+time.Millisecond); !errors.Is(err, driver.ErrInvalid) {
			t.Fatalf("%s: Refresh with MaxTTL + 1ms: %v, want ErrInvalid", name, err)
		}
		if err := l.Refresh(ctx, key, "b", MaxTTL); err != nil {
			t.Fatalf("%s: Refresh with MaxTTL: %v", name, err)
		}
		if err := l.Release(ctx, key, "b"); err != nil {
			t.Fatalf("%s: Release: %v", name, err)
		}
	}
}
