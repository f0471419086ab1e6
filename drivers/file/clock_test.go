package file

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/go-locker/locker/driver"
)

// stepWallClock steps the wall clock the driver sees by d (the host's clock
// is left alone), until the test ends.
func stepWallClock(t *testing.T, d time.Duration) {
	t.Helper()
	wallStep.Add(int64(d))
	t.Cleanup(func() { wallStep.Store(0) })
}

// A wall clock stepped forward by far more than the TTL frees no lease:
// expiry runs on the monotonic clock.
func TestWallClockStepForwardKeepsLease(t *testing.T) {
	dir := t.TempDir()
	a, b := open(t, dir), open(t, dir)
	ctx := ctxT(t)
	tok, err := a.Acquire(ctx, "k", "A", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	stepWallClock(t, 24*time.Hour)
	_, err = b.Acquire(ctx, "k", "B", time.Minute)
	var held *driver.HeldError
	if !errors.As(err, &held) || held.Remaining <= 50*time.Second || held.Remaining > time.Minute {
		t.Fatalf("Acquire by another owner after a forward step = %v, want HeldError with about a minute left", err)
	}
	if info, err := b.Inspect(ctx, "k"); err != nil || info.Owner != "A" || info.Token != tok {
		t.Fatalf("Inspect after a forward step = %+v, %v", info, err)
	}
	if err := a.Refresh(ctx, "k", "A", time.Minute); err != nil {
		t.Fatalf("Refresh by the holder after a forward step = %v", err)
	}
}

// A wall clock stepped back never repeats a token for a key, even with the
// token counter file deleted: the key's record, released or expired, floors
// the next token.
func TestWallClockStepBackNeverRepeatsToken(t *testing.T) {
	dir := t.TempDir()
	a, b := open(t, dir), open(t, dir)
	ctx := ctxT(t)
	counter := filepath.Join(dir, tokenFile)
	stepWallClock(t, time.Hour) // the first grants are an hour "ahead"

	// Released.
	t1, err := a.Acquire(ctx, "k", "A", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Release(ctx, "k", "A"); err != nil {
		t.Fatal(err)
	}
	// Expired.
	t2, err := a.Acquire(ctx, "e", "A", time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	waitExpired(t, a, "e")

	stepWallClock(t, -2*time.Hour) // an hour behind the first grants
	if err := os.Remove(counter); err != nil {
		t.Fatal(err)
	}
	if t3, err := b.Acquire(ctx, "k", "B", time.Minute); err != nil || t3 <= t1 {
		t.Fatalf("Acquire of a released key after a backward step, counter deleted = %d, %v; want above %d", t3, err, t1)
	}
	if err := os.Remove(counter); err != nil {
		t.Fatal(err)
	}
	if t4, err := b.Acquire(ctx, "e", "B", time.Minute); err != nil || t4 <= t2 {
		t.Fatalf("Acquire of an expired key after a backward step, counter deleted = %d, %v; want above %d", t4, err, t2)
	}
}

// A record written during another boot has expired, whatever its expiry
// says; its token still floors the next one.
func TestRecordFromAnotherBootExpired(t *testing.T) {
	l := open(t, t.TempDir())
	ctx := ctxT(t)
	old := lease{token: 1 << 60, boot: "00000000-0000-0000-0000-000000000000", expires: monoNow() + int64(time.Hour), owner: "X", key: "k"}
	if err := os.WriteFile(l.Path("k"), old.encode(nil), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Inspect(ctx, "k"); !errors.Is(err, driver.ErrNotHeld) {
		t.Fatalf("Inspect of another boot's lease = %v, want ErrNotHeld", err)
	}
	tok, err := l.Acquire(ctx, "k", "o", time.Minute)
	if err != nil || tok <= old.token {
		t.Fatalf("Acquire over another boot's lease = %d, %v; want a token above %d", tok, err, old.token)
	}
}

// A version 1 record (an earlier version's) is honoured on the wall clock,
// and its token floors the next one.
func TestVersion1RecordHonoured(t *testing.T) {
	l := open(t, t.TempDir())
	ctx := ctxT(t)
	const tok1 = 1 << 60
	line := "1 " + strconv.FormatUint(tok1, 10) + " " + strconv.FormatInt(time.Now().Add(time.Hour).UnixNano(), 10) + " \"X\" \"k\"\n"
	if err := os.WriteFile(l.Path("k"), []byte(line), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Acquire(ctx, "k", "o", time.Minute); !errors.Is(err, driver.ErrNotAcquired) {
		t.Fatalf("Acquire over a version 1 lease in force = %v, want ErrNotAcquired", err)
	}
	if info, err := l.Inspect(ctx, "k"); err != nil || info.Owner != "X" || info.Token != tok1 {
		t.Fatalf("Inspect of a version 1 lease = %+v, %v", info, err)
	}
	stepWallClock(t, 2*time.Hour)
	tok, err := l.Acquire(ctx, "k", "o", time.Minute)
	if err != nil || tok <= tok1 {
		t.Fatalf("Acquire over an expired version 1 lease = %d, %v; want a token above %d", tok, err, tok1)
	}
	if r := readRecord(t, l.Path("k")); r.boot != l.boot {
		t.Fatalf("rewritten record %+v is not version 2", r)
	}
}
