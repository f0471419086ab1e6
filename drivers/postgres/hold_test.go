package postgres_test

import (
	"context"
	"errors"
	"os"
	"testing"
	"time"

	"github.com/go-locker/locker"
	_ "github.com/go-locker/locker/drivers/postgres"
	"github.com/go-locker/locker/internal/pgtest"
)

// holdLate is how late, on this loaded 2-core machine under -race, a grant
// may come after the moment the hold policy frees the key: the server's
// idle timer and backend exit (1–20ms here) plus scheduling.
const holdLate = 500 * time.Millisecond

// WithMinHold and WithMaxHold on a real PostgreSQL server, through package
// locker: the min hold keeps the key from a waiter blocked in the server
// until the bound although the holder released it at once; the max hold
// closes Lost at the bound and hands the key to the waiter right after.
func TestHoldPolicy(t *testing.T) {
	url := os.Getenv("LOCKER_TEST_POSTGRES_URL")
	if url == "" {
		url = pgtest.Start(t).URL()
	}
	open := func() *locker.Locker {
		l, err := locker.OpenURL(url)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { l.Close() })
		return l
	}
	holder, other := open(), open()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	key := "hold-policy/" + time.Now().Format(time.RFC3339Nano)

	t.Run("MinHold", func(t *testing.T) {
		const minHold = 1500 * time.Millisecond
		before := time.Now()
		lk, err := holder.Acquire(ctx, key+"/min", locker.WithTTL(10*time.Second), locker.WithMinHold(minHold))
		if err != nil {
			t.Fatal(err)
		}
		after := time.Now()
		if err := lk.Release(ctx); err != nil {
			t.Fatalf("early Release: %v", err)
		}
		if _, err := other.TryAcquire(ctx, key+"/min"); !errors.Is(err, locker.ErrNotAcquired) {
			t.Fatalf("TryAcquire during the min hold: %v", err)
		}
		next, err := other.Acquire(ctx, key+"/min") // blocks in the server's lock manager
		if err != nil {
			t.Fatal(err)
		}
		granted := time.Now()
		defer next.Release(ctx)
		t.Logf("granted %v after the first grant (min hold %v)", granted.Sub(after), minHold)
		if granted.Before(before.Add(minHold)) || granted.After(after.Add(minHold+holdLate)) {
			t.Fatalf("granted %v after the start of the first Acquire, want %v (+%v)", granted.Sub(before), minHold, holdLate)
		}
		if next.Token() <= lk.Token() {
			t.Fatalf("token %d after %d", next.Token(), lk.Token())
		}
	})

	t.Run("MaxHold", func(t *testing.T) {
		const maxHold = time.Second
		before := time.Now()
		lk, err := holder.Acquire(ctx, key+"/max", locker.WithTTL(600*time.Millisecond), locker.WithMaxHold(maxHold))
		if err != nil {
			t.Fatal(err)
		}
		// The waiter reports through got only: it may outlive a failed test.
		type grant struct {
			at    time.Time
			err   error
			early bool // granted before the holder's Lost closed
		}
		got := make(chan grant, 1)
		go func() {
			next, err := other.Acquire(ctx, key+"/max")
			if err != nil {
				got <- grant{err: err}
				return
			}
			g := grant{at: time.Now(), early: true}
			select {
			case <-lk.Lost():
				g.early = false
			default:
			}
			next.Release(ctx)
			got <- g
		}()
		select {
		case <-lk.Lost():
		case <-time.After(30 * time.Second):
			t.Fatal("Lost did not close")
		}
		lostAt := time.Since(before)
		if lostAt < maxHold || lostAt > maxHold+holdLate {
			t.Fatalf("Lost closed %v after the start of Acquire, want %v (+%v)", lostAt, maxHold, holdLate)
		}
		if !errors.Is(lk.Err(), locker.CauseMaxHold) {
			t.Fatalf("Err() = %v", lk.Err())
		}
		g := <-got
		if g.err != nil {
			t.Fatalf("the waiter: %v", g.err)
		}
		if g.early {
			t.Fatal("the waiter was granted the key before the holder's Lost closed")
		}
		grantedAt := g.at.Sub(before)
		t.Logf("Lost at %v, waiter granted at %v", lostAt, grantedAt)
		if grantedAt < maxHold || grantedAt > maxHold+holdLate {
			t.Fatalf("the waiter was granted %v after the start, want %v (+%v)", grantedAt, maxHold, holdLate)
		}
	})
}
