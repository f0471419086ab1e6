package etcd

import (
	"context"
	"errors"
	"strconv"
	"time"

	"github.com/go-locker/locker/driver"
)

// A waiting Acquire of a mutex (driver.BlockingAcquirer) is granted in
// order: it takes a free lock key only while nobody queues for it, and
// otherwise queues an entry under MutexQueuePrefix and waits as a write
// lock's request does (sharedwait.go), for the entry before its own and,
// once first, for the lock key's deletion. The grant is the same
// transaction as Acquire's, with a fresh lease of the TTL asked, and it
// deletes the entry. So a process that releases and asks again queues
// behind those already waiting, as with concurrency.Mutex, and a waiter
// that stopped (killed, paused, cut off) holds the queue up until its wait
// lease lapses.
//
// A one-shot Acquire does not look at this queue: it takes a free key even
// while others wait, as sync.Mutex.TryLock may.

var _ driver.BlockingAcquirer = (*Locker)(nil)

// MutexQueuePrefix returns the etcd prefix under which waiting Acquires of
// the mutex on key queue: prefix + "/w/q/" + len(key) + ":" + key + "/".
// It is in the waiters' key space, apart from every WaitPrefix (those go
// on with a digit after "/w/").
func (l *Locker) MutexQueuePrefix(key string) string {
	return l.prefix + "/w/q/" + strconv.Itoa(len(key)) + ":" + key + "/"
}

// AcquireWait implements driver.BlockingAcquirer: Acquire, in the order the
// callers asked, waiting until key is granted to owner or ctx ends. When
// the key is free and nobody queues for it, it is one transaction, as
// Acquire is; an owner that holds key already gets its token at once.
//
// Errors: driver.ErrInvalid for a bad key, owner or ttl; driver.ErrClosed
// after Close; ctx.Err() (wrapped) when ctx ends first, leaving nothing
// held or queued; driver.ErrUnavailable when the cluster cannot serve the
// first attempt (a wait already queued retries until ctx ends).
func (l *Locker) AcquireWait(ctx context.Context, key, owner string, ttl time.Duration) (uint64, error) {
	if err := l.check("acquire", key, owner); err != nil {
		return 0, err
	}
	secs, err := l.ttlSeconds("acquire", ttl)
	if err != nil {
		return 0, err
	}
	if err := ctx.Err(); err != nil {
		return 0, l.fail(ctx, "acquire", key, err)
	}
	sk := &sharedKey{key: key, base: l.MutexQueuePrefix(key), owner: owner, k: l.LockKey(key), mutex: true}
	var token uint64
	err = l.withPushback(ctx, l.acquireTurns, func(cctx context.Context) (err error) {
		token, err = l.acquire(cctx, sk.k, owner, secs, sk.queue())
		return err
	})
	if errors.Is(err, driver.ErrNotAcquired) {
		token, err = l.waitShared(ctx, sk, secs)
	}
	if err != nil {
		return 0, l.fail(ctx, "acquire", key, err)
	}
	return token, nil
}
