package rediscore

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"time"

	"github.com/go-locker/locker/driver"
)

// HoldReader reads a lock key on a connection whose reads the server tracks
// (CLIENT TRACKING), so that the read also makes the server send an
// invalidation the next time the key changes: is deleted, expires, is
// evicted or is written. exists is false for an absent key.
type HoldReader func(ctx context.Context, lock string) (value string, exists bool, err error)

// holdReadTimeout bounds one re-read of a watched key.
const holdReadTimeout = 5 * time.Second

// holdRetryMax caps the backoff between failed re-reads: once the server
// is back, a key it lost (a restart without persistence, a failover) is
// found gone within about this long.
const holdRetryMax = 200 * time.Millisecond

// HoldWatch implements the core of driver.HoldWatcher over client-side
// tracking: each watched lock key is read on a tracking connection, and
// re-read after each invalidation of it (tracking is one-shot, so the read
// re-arms it). A read that finds the key absent, or holding another value
// than the grant's "<token>:<owner>", reports the grant lost. The owner's
// own refreshes invalidate the key too; their re-read finds the grant and
// reports nothing. The owner's release through the same Locker is
// announced first (Releasing), so its deletion is not reported either. A read that fails (the watch connection is down) reports
// nothing and is retried until it succeeds, the backoff growing from 10ms
// to 200ms: a lost connection is not a lost lock, and the grant is checked
// again once the connection is back (see Reset).
//
// The driver feeds it: Invalidate with the keys of each invalidation
// message, Reset when the tracking connection was lost or re-established
// (every watched key is then re-read).
type HoldWatch struct {
	p      prefix // starts its errors: "redis" unless set by NewLocker
	read   HoldReader
	prefix string

	mu       sync.Mutex
	keys     map[string]*holdKey
	closed   bool
	releases uint64 // numbers the Releasing calls
	wg       sync.WaitGroup
	batch    *holdQueue // nil: each key read on its own (SetBatchReader)
	// life ends at Close: it cuts short a batch of reads under way.
	life context.Context
	end  context.CancelFunc
}

// holdKey is one watched lock key. It is also the context of its reads,
// done when the watch of the key ends.
type holdKey struct {
	lock    string // the lock key
	entries entrySet
	one     [1]*holdEntry // entries' first backing array
	first   holdEntry     // the key's first entry
	dirty   chan struct{} // buffered 1: a re-read is due, or the watch ended
	// Under afterMu: ended is set when the last entry leaves; stop, made
	// by the first Done (a read), is closed then; afters are the functions
	// AfterFunc registered, run then.
	afterMu sync.Mutex
	ended   bool
	stop    chan struct{}
	afters  map[*func()]struct{}
	// inval counts the invalidations of the key (under HoldWatch.mu);
	// readInval is its value when the last completed read began.
	inval, readInval uint64
}

type holdEntry struct {
	key, owner string
	token      uint64
	once       sync.Once
	lost       func(error)
	releasing  uint64 // the owner's Release under way (its number), 0 if none: no alarm

	// A change watch (WatchChanges) has changed instead of lost, and
	// remembers the last value read ("" with seen false before the first).
	changed func()
	last    string
	seen    bool
}

// NewHoldWatch returns a HoldWatch reading with read; prefix is the key
// prefix (Options.Prefix).
func NewHoldWatch(read HoldReader, prefix string) *HoldWatch {
	life, end := context.WithCancel(context.Background())
	return &HoldWatch{p: "redis", read: read, prefix: prefix, keys: map[string]*holdKey{}, life: life, end: end}
}

// Watch implements driver.HoldWatcher.WatchHold: it starts watching key's
// grant to owner with token and returns at once; the first read (which arms
// the tracking) runs in the background. Errors: driver.ErrClosed after
// Close.
func (h *HoldWatch) Watch(key, owner string, token uint64, lost func(error)) (stop func(), err error) {
	return h.add(key, func(e *holdEntry) { e.owner, e.token, e.lost = owner, token, lost })
}

// WatchChanges implements driver.ChangeWatcher over the same reads: changed
// is called after each read of key that finds another value than the last
// (a grant puts "<token>:<owner>", a release, an expiry or an eviction
// deletes it; a refresh keeps it), the first read included, so that a
// change between the call and the first read (which arms the tracking) is
// reported too; and after a read that finds key absent again when an
// invalidation came since the last read (a grant and its release both fell
// between the two reads). It returns at once. Errors: driver.ErrClosed
// after Close.
func (h *HoldWatch) WatchChanges(key string, changed func()) (stop func(), err error) {
	return h.add(key, func(e *holdEntry) { e.changed = changed })
}

// isGrant reports whether v is the lock key's value for the grant of
// token to owner: "<token>:<owner>".
func isGrant(v string, token uint64, owner string) bool {
	var buf [20]byte
	t := strconv.AppendUint(buf[:0], token, 10)
	n := len(t)
	return len(v) == n+1+len(owner) && v[:n] == string(t) && v[n] == ':' && v[n+1:] == owner
}

// add starts watching key with a new entry, which set fills in. A key's
// first entry is kept in its holdKey, saving an allocation.
func (h *HoldWatch) add(key string, set func(*holdEntry)) (stop func(), err error) {
	var buf [128]byte
	lock := appendLockKey(buf[:0], h.prefix, key)
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return nil, h.p.errorf("%w", driver.ErrClosed)
	}
	var e *holdEntry
	k := h.keys[string(lock)]
	if k == nil {
		k = &holdKey{lock: string(lock), dirty: make(chan struct{}, 1)}
		k.entries = k.one[:0]
		h.keys[k.lock] = k
		h.wg.Add(1)
		go h.loop(k.lock, k)
		e = &k.first
	} else {
		e = new(holdEntry)
	}
	e.key = key
	set(e)
	k.entries.add(e)
	k.mark()
	return func() { h.remove(k, e) }, nil
}

// end stops k's loop, cutting short a read under way. Called under
// HoldWatch.mu, once.
func (k *holdKey) end() {
	k.afterMu.Lock()
	k.ended = true
	if k.stop != nil {
		close(k.stop)
	}
	afters := k.afters
	k.afters = nil
	k.afterMu.Unlock()
	for f := range afters {
		go (*f)()
	}
	k.mark() // the loop sees ended
}

// AfterFunc arranges for f to run in its own goroutine when the watch of
// the key ends; stop, as context.AfterFunc's. With it, a context derived
// from k (the read timeouts) follows k without a goroutine of its own.
func (k *holdKey) AfterFunc(f func()) (stop func() bool) {
	k.afterMu.Lock()
	defer k.afterMu.Unlock()
	if k.ended {
		go f()
		return func() bool { return false }
	}
	if k.afters == nil {
		k.afters = map[*func()]struct{}{}
	}
	p := &f
	k.afters[p] = struct{}{}
	return func() bool {
		k.afterMu.Lock()
		defer k.afterMu.Unlock()
		_, ok := k.afters[p]
		delete(k.afters, p)
		return ok
	}
}

// Deadline implements context.Context: none.
func (k *holdKey) Deadline() (time.Time, bool) { return time.Time{}, false }

// Done implements context.Context: closed when the watch of the key ends.
// It is made on the first call: a hold released before the watch's first
// read needs none.
func (k *holdKey) Done() <-chan struct{} {
	k.afterMu.Lock()
	defer k.afterMu.Unlock()
	if k.stop == nil {
		k.stop = make(chan struct{})
		if k.ended {
			close(k.stop)
		}
	}
	return k.stop
}

// Err implements context.Context: context.Canceled once the watch of the
// key ended.
func (k *holdKey) Err() error {
	k.afterMu.Lock()
	defer k.afterMu.Unlock()
	if k.ended {
		return context.Canceled
	}
	return nil
}

// Value implements context.Context: none.
func (k *holdKey) Value(any) any { return nil }

// entrySet is the watches of one key: a slice, as a key rarely has more
// than one.
type entrySet []*holdEntry

func (s *entrySet) add(e *holdEntry) { *s = append(*s, e) }

// remove removes e and reports whether it was there.
func (s *entrySet) remove(e *holdEntry) bool {
	for i, x := range *s {
		if x == e {
			last := len(*s) - 1
			(*s)[i] = (*s)[last]
			(*s)[last] = nil
			*s = (*s)[:last]
			return true
		}
	}
	return false
}

func (k *holdKey) mark() {
	select {
	case k.dirty <- struct{}{}:
	default:
	}
}

// remove ends e's watch; the key's loop ends with its last entry.
func (h *HoldWatch) remove(k *holdKey, e *holdEntry) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.removeLocked(k, e)
}

// removeLocked is remove with HoldWatch.mu held.
func (h *HoldWatch) removeLocked(k *holdKey, e *holdEntry) {
	if !k.entries.remove(e) {
		return
	}
	if len(k.entries) == 0 && h.keys[k.lock] == k {
		delete(h.keys, k.lock)
		k.end()
	}
}

// Invalidate is called with the lock keys of an invalidation message (any
// key not watched is ignored). It does not block.
func (h *HoldWatch) Invalidate(keys ...string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, lock := range keys {
		if k := h.keys[lock]; k != nil {
			k.inval++
			k.mark()
		}
	}
}

// Reset is called when the tracking connection was lost or replaced:
// every watched key is read again (which re-arms its tracking). It does not
// block.
func (h *HoldWatch) Reset() {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, k := range h.keys {
		for _, e := range k.entries {
			// A change while the connection was down may have been
			// missed: report the next read whatever it finds.
			e.seen = false
		}
		k.mark()
	}
}

// Releasing is called before owner releases key through the watched
// Locker: the owner's own release is not a loss, so its watches of key
// report nothing from now on. Its Done must be called with the release's
// result: on success, or driver.ErrNotHeld (the lock was gone already, and
// the release says so), those watches end; on any other error the lock may
// still be held, and they resume with a fresh read.
func (h *HoldWatch) Releasing(key, owner string) Releasing {
	var buf [128]byte
	lock := appendLockKey(buf[:0], h.prefix, key)
	h.mu.Lock()
	defer h.mu.Unlock()
	k := h.keys[string(lock)]
	if k == nil {
		return Releasing{}
	}
	h.releases++
	r := Releasing{h: h, k: k, seq: h.releases}
	for _, e := range k.entries {
		if e.owner == owner && e.releasing == 0 && e.changed == nil {
			e.releasing = r.seq
			r.n++
		}
	}
	return r
}

// Releasing is a release under way, from HoldWatch.Releasing. The zero
// value's Done does nothing.
type Releasing struct {
	h   *HoldWatch
	k   *holdKey
	seq uint64 // this release's number
	n   int    // entries this release marked
}

// Done ends the release that Releasing announced, with its result err.
func (r Releasing) Done(err error) {
	if r.n == 0 {
		return
	}
	h, k := r.h, r.k
	h.mu.Lock()
	defer h.mu.Unlock()
	ended := err == nil || errors.Is(err, driver.ErrNotHeld)
	for i := 0; i < len(k.entries) && r.n > 0; {
		e := k.entries[i]
		if e.releasing != r.seq {
			i++
			continue
		}
		r.n--
		if ended {
			h.removeLocked(k, e) // swaps the last entry into i
			continue
		}
		e.releasing = 0
		i++
	}
	if !ended {
		k.mark()
	}
}

// Close ends every watch without reporting anything and waits for the
// background reads to return. It is idempotent.
func (h *HoldWatch) Close() {
	h.mu.Lock()
	if !h.closed {
		h.closed = true
		for lock, k := range h.keys {
			delete(h.keys, lock)
			k.end()
		}
	}
	h.mu.Unlock()
	h.end()
	h.wg.Wait()
}

// loop re-reads lock whenever it is marked dirty, until its last entry
// leaves.
func (h *HoldWatch) loop(lock string, k *holdKey) {
	defer h.wg.Done()
	var ctx context.Context = k
	backoff := 10 * time.Millisecond
	for {
		<-k.dirty
		if k.Err() != nil {
			return
		}
		if !h.watching(k) {
			// Every entry is being released: the owner's own DEL is what
			// invalidated the key, and done either ends the watch or marks
			// the key again.
			continue
		}
		h.mu.Lock()
		inval := k.inval
		h.mu.Unlock()
		rctx, rcancel := context.WithTimeout(ctx, holdReadTimeout)
		v, exists, err := h.readKey(rctx, lock)
		rcancel()
		if err != nil {
			// Not a loss: retry until the connection is back.
			t := time.NewTimer(backoff)
			select {
			case <-k.Done():
				t.Stop()
				return
			case <-t.C:
			}
			backoff = min(2*backoff, holdRetryMax)
			k.mark()
			continue
		}
		backoff = 10 * time.Millisecond
		h.check(lock, k, v, exists, inval)
	}
}

// watching reports whether k has an entry whose release is not under way.
func (h *HoldWatch) watching(k *holdKey) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, e := range k.entries {
		if e.releasing == 0 {
			return true
		}
	}
	return false
}

// check reports lost every entry of k whose grant the value read does not
// show, and reports to every change watch a value other than its last. A
// read that began at invalidation count inval and finds the key absent, as
// the last read did, still reports a change when an invalidation came in
// between: the key was written since, and removed again before the read (a
// grant and its release or expiry). Every grant's value is new (tokens
// increase), so that is the one change two reads can fail to tell apart.
func (h *HoldWatch) check(lock string, k *holdKey, v string, exists bool, inval uint64) {
	var gone, changed []*holdEntry
	cur := "\x00" // absent: no value starts with a NUL byte (a token comes first)
	if exists {
		cur = v
	}
	h.mu.Lock()
	written := !exists && inval != k.readInval
	k.readInval = inval
	for _, e := range k.entries {
		if e.changed != nil {
			if !e.seen || e.last != cur || written {
				e.seen, e.last = true, cur
				changed = append(changed, e)
			}
			continue
		}
		if e.releasing != 0 {
			continue
		}
		if !exists || !isGrant(v, e.token, e.owner) {
			gone = append(gone, e)
		}
	}
	for _, e := range gone {
		k.entries.remove(e)
	}
	if len(k.entries) == 0 && h.keys[lock] == k {
		delete(h.keys, lock)
		k.end()
	}
	h.mu.Unlock()
	for _, e := range changed {
		e.changed()
	}
	for _, e := range gone {
		why := "deleted, evicted or expired"
		if exists {
			why = "overwritten by another grant"
		}
		err := h.p.errorf("lock %q %s on the server: %w", e.key, why, driver.ErrNotHeld)
		e.once.Do(func() { e.lost(err) })
	}
}
