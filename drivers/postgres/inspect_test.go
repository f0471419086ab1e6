package postgres

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/go-locker/locker/driver"
)

func TestInspect(t *testing.T) {
	url := serverURL(t)
	a, b := openT(t, url), openT(t, url)
	ctx := ctxFor(t, 30*time.Second)
	key := "inspect/" + time.Now().Format(time.RFC3339Nano)
	if _, err := b.Inspect(ctx, key); !errors.Is(err, driver.ErrNotHeld) {
		t.Fatalf("Inspect of a free key: %v", err)
	}
	if _, err := b.Inspect(ctx, ""); !errors.Is(err, driver.ErrInvalid) {
		t.Fatalf("Inspect of an empty key: %v", err)
	}
	long := strings.Repeat("ø", 40)
	tok, err := a.Acquire(ctx, key, long, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	own, err := a.Inspect(ctx, key)
	if err != nil || own.Owner != long || own.Token != tok || own.Remaining <= 0 || own.Remaining > time.Minute {
		t.Fatalf("Inspect by the holder's Locker: %+v %v", own, err)
	}
	other, err := b.Inspect(ctx, key)
	if err != nil || other.Owner != ownerTag(long) || other.Token != tok || other.Remaining <= 0 {
		t.Fatalf("Inspect by another Locker: %+v %v", other, err)
	}
	// A session that is not a locker holder, on the same advisory key.
	if err := a.Release(ctx, key, long); err != nil {
		t.Fatal(err)
	}
	c, err := poolT(t, url).Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Release()
	adv := AdvisoryKey(DefaultNamespace, key)
	if _, err := c.Exec(ctx, `SELECT pg_advisory_lock($1)`, adv); err != nil {
		t.Fatal(err)
	}
	defer c.Exec(ctx, `SELECT pg_advisory_unlock($1)`, adv)
	if info, err := b.Inspect(ctx, key); err != nil || info != (driver.Info{}) {
		t.Fatalf("Inspect of a foreign holder: %+v %v", info, err)
	}
}
