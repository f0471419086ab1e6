package drivertest

import (
	"context"
	"errors"
	"net/url"
	"strconv"
	"testing"
	"time"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/internal/rediscore"
	"github.com/go-locker/locker/internal/redistest"
)

// HandoffBound is the longest time allowed between a key becoming free and
// its next queued waiter's grant: a notification and a round trip, measured
// at 1–57ms, and 103ms once on a loaded CI machine; far below the 1.6s at
// which the root's fallback timer would grant it without one.
const HandoffBound = 250 * time.Millisecond

// OddCase is a key, an owner and a key prefix holding bytes a separator
// could be confused with.
type OddCase struct {
	Name, Key, Owner, Prefix string
}

// OddCases are the keys, owners and prefixes the key tests run: spaces,
// colons, newlines, braces, non-UTF-8 bytes, and a key that looks like a
// nudge.
var OddCases = []OddCase{
	{"space", "tenant 42/report", "worker 7", ""},
	{"prefix-space", "report", "worker", "my app"},
	{"colons", "a:b:c", "own:er:1", "p:q"},
	{"newline", "line\nbreak", "own\ner", "pre\nfix"},
	{"braces", "{tag} x", "{o} 1", ""},
	{"nudge-like", "{5}x 7", "{5}", ""},
	{"non-utf8", "\xff\xfe k\x00", "\xc3\x28 o", "\xfe"},
}

// prefixed returns d for keys under prefix (its URL carrying it).
func (d Deployment) prefixed(prefix string) Deployment {
	if prefix != "" {
		d.URL = With(d.URL, "prefix="+url.QueryEscape(prefix))
		d.Prefix = prefix
	}
	return d
}

// lockAt returns the server holding key's lock key, and that key.
func (d Deployment) lockAt(key string) (*redistest.Server, string) {
	lock, _, _ := rediscore.Keys(d.Prefix, key)
	for _, s := range d.Servers {
		if v, err := s.Do("EXISTS", lock); err == nil && v == int64(1) {
			return s, lock
		}
	}
	return nil, lock
}

// grantedWithinOf fails unless the Acquire behind c returned a lock
// within HandoffBound of free (when the key became free, or a time
// before it).
func grantedWithinOf(t *testing.T, c <-chan acquired, free time.Time, what string) *locker.Lock {
	t.Helper()
	select {
	case r := <-c:
		if r.err != nil {
			t.Fatalf("%s: %v", what, r.err)
		}
		took := r.at.Sub(free)
		t.Logf("%s: granted %v after the key became free", what, took.Round(time.Millisecond))
		if took > HandoffBound {
			t.Fatalf("%s: granted %v after the key became free; want within %v", what, took, HandoffBound)
		}
		return r.lk
	case <-time.After(20 * time.Second):
		t.Fatalf("%s: never granted", what)
		return nil
	}
}

// acquireAsyncAs is acquireAsync with owner and options.
func acquireAsyncAs(ctx context.Context, l *locker.Locker, key string, opts ...locker.Option) <-chan acquired {
	c := make(chan acquired, 1)
	go func() {
		lk, err := l.Acquire(ctx, key, opts...)
		c <- acquired{lk, time.Now(), err}
	}()
	return c
}

// OddKeys runs, for each OddCase on d (whose URL should set a queue_ttl of
// several seconds, so that a heartbeat cannot pass for a wake-up):
//
//   - Inspect reports the owner, byte for byte, and the token;
//   - a release hands the key to the first queued waiter (a child process,
//     see MaybeChild), which crashes at once: the second waiter, nudged
//     with its TTL when it became first, is granted within HandoffBound of
//     the key's expiry;
//   - a hold watch reports the lock key deleted behind the holder's back
//     within HandoffBound.
func OddKeys(t *testing.T, d Deployment) {
	for _, c := range OddCases {
		t.Run(c.Name, func(t *testing.T) {
			pd := d.prefixed(c.Prefix)
			holder, second := Open(t, pd.URL), Open(t, pd.URL)
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			lk, err := holder.TryAcquire(ctx, c.Key, locker.WithOwner(c.Owner), locker.WithTTL(10*time.Second))
			if err != nil {
				t.Fatal(err)
			}
			info, err := holder.Inspect(ctx, c.Key)
			if err != nil || info.Owner != c.Owner || info.Token != lk.Token() {
				t.Fatalf("Inspect = %+v, %v; want owner %q, token %d", info, err, c.Owner, lk.Token())
			}
			// The first waiter, another process, takes the key with TTL
			// 300ms and crashes; the second, queued behind it, must have
			// been nudged with that TTL.
			const ttl = 300 * time.Millisecond
			a := startChild(t, childURLEnv+"="+pd.URL, childKeyEnv+"="+strconv.Quote(c.Key),
				childOwnEnv+"="+strconv.Quote(c.Owner+" a"), childTTLEnv+"="+ttl.String())
			a.expect("waiting")
			waitFor(t, 10*time.Second, "the first waiter in the queue", func() bool { return pd.queueLen(t, c.Key) == 1 })
			b := acquireAsyncAs(ctx, second, c.Key, locker.WithOwner(c.Owner+" b"), locker.WithTTL(10*time.Second))
			waitFor(t, 10*time.Second, "the second waiter in the queue", func() bool { return pd.queueLen(t, c.Key) == 2 })
			released := time.Now()
			if err := lk.Release(ctx); err != nil {
				t.Fatal(err)
			}
			a.expect("acquired true")
			if took := time.Since(released); took > HandoffBound {
				t.Fatalf("the first waiter: granted %v after the release (or later); want within %v", took, HandoffBound)
			}
			// A crash: the child's Locker must not release the key at its
			// safe deadline (os.Exit under -race can take that long).
			if err := a.cmd.Process.Kill(); err != nil {
				t.Fatal(err)
			}
			// The key expires ttl after the first waiter's grant, which
			// came after the release began.
			lb := grantedWithinOf(t, b, released.Add(ttl), "the second waiter, after the first one's crash and expiry")
			if info, err := second.Inspect(ctx, c.Key); err != nil || info.Owner != c.Owner+" b" || info.Token != lb.Token() {
				t.Fatalf("Inspect = %+v, %v; want owner %q, token %d", info, err, c.Owner+" b", lb.Token())
			}
			s, lock := pd.lockAt(c.Key)
			if s == nil {
				t.Fatalf("lock key %q on no server", lock)
			}
			waitTracked(t, s)
			if _, err := s.Do("DEL", lock); err != nil {
				t.Fatal(err)
			}
			deleted := time.Now()
			select {
			case <-lb.Lost():
				took := time.Since(deleted)
				t.Logf("Lost() closed %v after the lock key was deleted", took.Round(time.Millisecond))
				if took > HandoffBound || !errors.Is(lb.Err(), locker.CauseServer) {
					t.Fatalf("Lost() after %v with %v; want within %v, cause server", took, lb.Err(), HandoffBound)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("Lost() still open 5s after the lock key was deleted")
			}
			waitFor(t, 5*time.Second, "the queue keys to go", func() bool { return pd.queueKeys(c.Key) == 0 })
		})
	}
}

// waitTracked waits until s tracks some key for a client (INFO stats
// tracking_total_keys), so a hold watch is armed.
func waitTracked(t *testing.T, s *redistest.Server) {
	t.Helper()
	waitFor(t, 5*time.Second, "a tracked key", func() bool {
		v, err := s.Do("INFO", "stats")
		str, _ := v.(string)
		return err == nil && infoField(str, "tracking_total_keys:") > 0
	})
}

// infoField returns the integer after name in an INFO reply, or 0.
func infoField(info, name string) int {
	for i := 0; i+len(name) <= len(info); i++ {
		if info[i:i+len(name)] != name {
			continue
		}
		n := 0
		for j := i + len(name); j < len(info) && info[j] >= '0' && info[j] <= '9'; j++ {
			n = 10*n + int(info[j]-'0')
		}
		return n
	}
	return 0
}
