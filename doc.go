// Package locker provides distributed locks with fencing tokens, loss
// notification and waits without polling, over interchangeable backends, in
// the way database/sql provides databases.
//
// A program imports the drivers it wants for their side effect and opens a
// Locker by URL:
//
//	import (
//		"github.com/go-locker/locker"
//		_ "github.com/go-locker/locker/drivers/redis"
//	)
//
//	l, err := locker.OpenURL("redis://127.0.0.1:6379/0")
//	...
//	lk, err := l.Acquire(ctx, "nightly-report", locker.WithTTL(10*time.Second))
//	...
//	defer lk.Release(context.Background())
//	// Do the work; stop when <-lk.Lost() fires; pass lk.Token() to the
//	// resource so it can reject writes from an older holder.
//
// Switching backends is a change of URL: mem:// (one process), file:// (one
// host), redis://, rueidis://, etcd://, postgres://.
//
// # Guarantees
//
// Every driver passes the suite in package conformance, which checks:
// mutual exclusion (acquire is atomic); expiry after the TTL and not before;
// ownership (only the holder can refresh or release, including after its lock
// expired and was taken by someone else); strictly increasing fencing tokens
// per key across release, expiry and re-acquire; idempotent acquire by the
// same owner; prompt return once a context is done, leaving nothing held; keys
// that never interfere; and Close.
//
// On top of every driver this package adds: waiting without polling (see
// Locker.Acquire), renewal every TTL/3 while a lock is held (WithAutoRenew),
// and loss detection: Lock.Lost closes, and Do's context is cancelled, when a
// renewal learns the lock is gone or when the safe local deadline passes
// without a successful renewal. That deadline is the start of the last
// successful acquire or renewal on the monotonic clock, plus the TTL, minus a
// drift allowance of TTL/100 + 2ms or the driver's wider one
// (driver.Capabilities.Margin; Redlock: TTL×drift_factor + 2ms), so the
// holder learns of the loss before the server can grant the key to anyone
// else. Where the driver can see the server end a lock early
// (driver.HoldWatcher), Lost closes when it does. On a driver that can
// refresh many locks in one request (driver.BatchRefresher), the renewals
// of one Locker's locks that fall due within about 2ms of each other go to
// the server together; each lock keeps its own schedule, its own result
// and its own deadline, counted from when its batch was sent.
//
// # What no lock can do
//
// A process that is paused (garbage collection, swapping, SIGSTOP, a VM
// migration) for longer than its TTL, or cut off from the lock server but not
// from the resource, resumes believing it holds the lock for as long as it
// takes to notice otherwise. Lost closes as soon as the process runs again,
// but code already past its check acts on. Fencing tokens close that gap only
// if the protected resource checks them: store the highest token seen and
// reject requests carrying a lower one. A server whose clock jumps (rather than
// drifts) shortens or lengthens TTLs by the jump; keep server clocks slewed,
// not stepped.
//
// # Why a lock was lost
//
// Once Lost is closed, Lock.Err says why, with an error that matches
// ErrNotHeld and one LostCause: CauseDeadline (no successful renewal before
// the safe deadline), CauseExpired or CauseTaken (the server answered a
// renewal, Refresh or Release that the lock is gone; taken when the driver
// says another owner holds it), CauseServer (the driver saw the server end
// it, driver.HoldWatcher), CauseClosed (Locker.Close) and CauseMaxHold
// (WithMaxHold). Do's context has the same error as its cause.
//
// # Semaphores and read-write locks
//
// Locker.Semaphore(key, n) admits at most n holders of key at once, and
// Locker.RWMutex(key) any number of readers or one writer, writers
// preferred. Each hold is a Lock with its own lease, token and loss signal;
// the mutex, the semaphore and the read-write lock on one key are three
// different locks. They need a driver that implements driver.SharedLocker:
// for now drivers/mem, drivers/file, drivers/redis and drivers/rueidis do
// (not under Redlock), and on any other every call fails before any I/O
// with an error matching errors.ErrUnsupported.
//
// # Elections
//
// Locker.Election(name) is a leader election on the lock of the key
// ElectionPrefix + name: the holder leads, its fencing token is its term,
// and its owner carries the value it campaigned with. Campaign waits to be
// elected and returns the leader's Lock; Lead runs a function while this
// process leads (its context is cancelled when the lead is lost, before
// anyone else can be elected) and campaigns again; Leader and Observe show
// who leads. It works on every driver that implements driver.Inspector; on
// any other every call fails before any I/O with an error matching
// errors.ErrUnsupported.
//
// # Lease policy
//
// WithMaxHold bounds how long a lock is held, however long the work runs:
// at the bound renewal stops, Lost closes and the lock is released.
// WithMinHold keeps the key taken for a minimum time after the grant even if
// the work releases it earlier: the lock is left to expire at the bound.
// Both count from Lock.Granted, the moment the winning call returned (the
// latest the grant can have been, so neither bound is shorter than from
// the grant), however long the call waited; the safe deadline counts from
// the start of the request.
//
// # Closing
//
// Locker.Close is a barrier: it cuts short the calls in flight that wait,
// waits for every call in flight to finish, releases every lock held
// through the Locker and any grant made during Close (owner-checked), and
// closes the driver last. Calls it cut short, and every call after it,
// return errors matching ErrClosed, never ErrUnavailable. A second Close,
// concurrent or later, waits for the first and returns nil. Close does not
// wait for Do's fn: it cancels fn's context and releases its lock.
//
// # Observability
//
// A Locker reports to OpenTelemetry through the API only: metrics
// (locker.acquire.duration, locker.hold.duration, locker.renewals,
// locker.lost, locker.held) and spans (one per Acquire, TryAcquire and
// Release), under the scope ScopeName, to the global providers unless
// WithMeterProvider or WithTracerProvider says otherwise. Until the program
// installs an SDK it starts no span and reads no clock for them, so the
// default costs a few atomic loads per call (docs/benchmarks.md measures
// it). WithLogger
// logs failed renewals and losses; WithKeyName reports keys by a name of
// low cardinality, since keys themselves are never attributes.
//
// # Errors
//
// Errors are wrapped once, as "locker: op "key": cause", and match
// ErrNotAcquired, ErrNotHeld, ErrClosed, ErrInvalid, ErrUnavailable (the
// backend could not be reached; see its doc for how each call reports it),
// a LostCause after a loss, context.Canceled and context.DeadlineExceeded
// with errors.Is.
package locker
