// Package conformance is the test suite every locker driver runs against
// itself, ours and third parties' alike, in the manner of testing/fstest:
//
//	func TestConformance(t *testing.T) {
//		conformance.Run(t, conformance.Harness{
//			Open: func(ctx context.Context) (driver.Locker, error) {
//				return mydriver.Open(ctx, serverURL)
//			},
//			MinTTL: 100 * time.Millisecond,
//		})
//	}
//
// Run checks every sentence of package driver's contract that a driver can
// break and the suite can observe, through the raw driver.Locker (subtests
// "Driver/…") and through locker.New (subtests "Locker/…", for the promises
// package locker makes on top of the driver). The trace below lists each
// sentence, the subtest that fails when a driver breaks only that sentence,
// and the deliberately broken drivers (mutants) that the suite's own tests
// run to prove it: each mutant is one correct
// driver with one fault switched on, and must fail at that subtest, while
// the correct driver passes the whole suite.
//
// Subtest names are stable, so a failure can be rerun with -run. Every
// subtest uses fresh keys and runs under a watchdog: a driver that hangs
// fails with a message naming the subtest instead of hanging the test
// binary, and a driver that panics fails the subtest. Subtests run side by
// side (8 at a time): most of them wait for TTLs to run out. The subtests
// of an optional interface the driver lacks are not run, and Run says so.
//
// Timing checks fail only on proof. A call that sets a lock's TTL was sent
// at one moment and returned at a later one; the server may free the lock
// no earlier than the first plus the TTL less the driver's margin
// (driver.Capabilities.Margin), and must have freed it by the second plus
// the TTL plus TTL/4 + 750ms. A probe that takes the key too early, or
// that is sent too late and finds it held, is proof; a slow machine only
// delays probes, which can hide a violation but never invent one. The
// suite uses two TTLs, the unit (Harness.MinTTL, at least 100ms) and a long
// one (2 units + 2 × (unit/4 + 750ms)), so that no fixed TTL fits both.
//
// # Trace: contract sentence → subtest
//
// Package driver:
//
//   - [P1] "a Locker returns ErrNotAcquired, ErrNotHeld, ErrClosed, ErrInvalid and ErrUnavailable (possibly
//     wrapped) for the conditions they name" → see E1–E6.
//   - [P2] "Errors should not carry a "locker:" prefix — package locker adds it, once" → Driver/Errors;
//     mutant: errors-prefixed-locker.
//   - [P3] "but should name the backend ("redis: …") where they come from one" → not checked: the suite
//     cannot know a backend's name.
//   - [P4] "every other error is treated as transient by package locker" → not checked: binds package
//     locker and needs errors a reachable backend does not return (root tests TestRenewalRetriesTransientErrors,
//     TestWaitSurvivesTransientErrors).
//   - [P5] "This package depends on the standard library only." → not checked: not an obligation of a driver.
//
// Driver:
//
//   - [D1] "Open returns a Locker for the data source name dsn." → not checked: the Harness opens Lockers
//     through its own function (so that a driver built from an existing client is tested the same way); every
//     subtest uses what it returns.
//   - [D2] "every driver in this module takes a URL whose scheme is the name the driver is registered under,
//     and rejects unknown query parameters with an error wrapping ErrInvalid" → not checked: binds this
//     module's drivers only; each driver's own URL tests check it.
//
// Locker:
//
//   - [L1] "It is safe for concurrent use by multiple goroutines." → Driver/ConcurrentUse; mutant:
//     shared-scratch.
//   - [L2] "Each method makes one attempt: waiting, retrying and renewal belong to package locker." →
//     Driver/MutualExclusion (an Acquire of a held key answers at once); mutant: acquire-waits. A retry of a
//     failed call cannot be seen on a reachable backend.
//   - [L3] "the backend stores them with the lock and compares them on Refresh and Release" and "an owner
//     string that differs in any byte is not" → Driver/Ownership; mutants: release-without-owner-check,
//     refresh-without-owner-check, owner-prefix-compare.
//   - [L4] "The owner, not the Locker, holds a lock: the same owner string through another Locker on the same
//     backend is the holder" → Driver/OwnerAcrossLockers; mutant: owner-bound-to-locker.
//   - [L4b] "a backend whose locks belong to the connection that took them … declares
//     Capabilities.LockerBound, and then the same owner through another Locker is refused (ErrNotAcquired,
//     ErrNotHeld) and changes nothing" → Driver/OwnerAcrossLockers; mutant: locker-bound-release-frees.
//   - [L5] "A key is any non-empty string, and distinct keys never interfere." → Driver/Keys; mutant:
//     keys-case-insensitive.
//   - [L6] "Every method that takes a key returns an error wrapping ErrInvalid for an empty one, and every
//     method that takes a ttl for a non-positive one; such a call changes nothing." → Driver/BadInput;
//     mutants: release-empty-key-not-invalid, refresh-accepts-bad-ttl.
//   - [L7] "A driver may also reject keys longer than a limit it documents." → not checked: a permission.
//   - [L8] "Every method returns promptly once ctx is done, with an error wrapping ctx.Err(); a call whose ctx
//     is already done changes nothing." → Driver/Context; mutants: ignores-context, done-ctx-acquire-grants.
//     Subscribe and AcquireWait: W10, B4.
//
// Locker.Acquire:
//
//   - [A1] "Acquire makes one atomic attempt to take key" → Driver/AtomicAcquire; mutant: check-then-set.
//   - [A2] "for owner" → see L3, L4.
//   - [A3] "It returns a fencing token, or ErrNotAcquired if another owner holds key" →
//     Driver/MutualExclusion; mutants: acquire-ignores-holder, held-plain-error.
//   - [A4] "(a *HeldError, which wraps ErrNotAcquired, is preferred: it tells the caller when to try again)" →
//     see H1–H3.
//   - [A5] "Acquire by the current owner is idempotent: it succeeds, … and returns the same token" →
//     Driver/IdempotentAcquire; mutants: idempotent-refused, idempotent-new-token.
//   - [A6] "resets the ttl" (to the one it is handed, longer or shorter) → Driver/IdempotentAcquire; mutants:
//     idempotent-keeps-ttl, idempotent-only-extends.
//   - [A7] "The lock then lives for ttl, counted from the call" (each ttl it is handed, a short and a long
//     one) → Driver/TTL; mutant: acquire-fixed-ttl.
//   - [A8] "the server frees it no earlier than ttl, less Capabilities.Margin(ttl), after the call was sent"
//     → Driver/Expiry; mutant: expires-before-margin.
//   - [A9] "and soon after ttl has passed" → Driver/Expiry; mutant: never-expires.
//   - [A10] "A ttl the backend cannot keep exactly is rounded up as Capabilities.RoundTTL says, never down."
//     → Driver/Capabilities; mutant: granularity-rounds-down.
//   - [A11] "The token is strictly greater than the token of every earlier grant of key: across release,
//     expiry and re-acquire." → Driver/Fencing; mutants: tokens-repeat-after-expiry, tokens-per-locker,
//     tokens-reset-on-release.
//   - [A12] "An Acquire by the former owner of an expired lock is such a new grant, not the old one revived."
//     → Driver/Expired; mutant: reacquire-revives-expired.
//
// Locker.Refresh:
//
//   - [R1] "Refresh resets the ttl of a lock owner holds" and "The new ttl counts from the call and replaces
//     the one in force, whether it is longer or shorter." → Driver/RefreshTTL; mutants: refresh-ignores-ttl,
//     refresh-only-extends.
//   - [R2] "or returns ErrNotHeld and changes nothing" (held by another owner; a former holder) →
//     Driver/Ownership; mutant: foreign-refresh-extends.
//   - [R3] "or returns ErrNotHeld and changes nothing" (a key never taken; a released lock) →
//     Driver/NotHeld; mutant: refresh-free-creates.
//   - [R4] "An expired lock is not revived." → Driver/RefreshDoesNotRevive; mutant: refresh-revives-expired.
//
// Locker.Release:
//
//   - [Re1] "Release frees a lock owner holds" → Driver/MutualExclusion; mutant: release-noop.
//   - [Re2] "or returns ErrNotHeld and changes nothing" (a key never taken; a released lock) →
//     Driver/NotHeld; mutant: release-free-returns-nil. Held by another owner: L3.
//   - [Re3] "or returns ErrNotHeld and changes nothing" (an expired lock) → Driver/Expired; mutant:
//     release-expired-returns-nil.
//
// Locker.Close:
//
//   - [C1] "Close releases the Locker's resources." → not checked: resources are not visible through the
//     interface; a driver's own tests count its connections and goroutines.
//   - [C2] "It is idempotent" → Driver/Close; mutant: close-twice-errors.
//   - [C3] "calls after Close, of every method of every interface the Locker implements, return ErrClosed"
//     → Driver/Close; mutant: closed-optional-calls-work.
//   - [C4] "Locks still held on the server are left to expire: nothing renews them after Close, so they end
//     by their TTL at the latest" → Driver/Close; mutant: close-keeps-renewing.
//   - [C5] "Package locker releases its own locks before calling Close." → Locker/Close; mutant:
//     release-noop (the closed Locker's lock stays held).
//
// Sentinel errors:
//
//   - [E1] ErrNotAcquired "means the lock is held by another owner" → Driver/MutualExclusion; mutant:
//     held-plain-error.
//   - [E2] ErrNotHeld "means the caller does not hold the lock (any more)" → Driver/NotHeld; mutant:
//     notheld-plain-error. Every state: held by another owner and taken over (Driver/Ownership), never
//     taken and released (Driver/NotHeld), expired (Driver/Expired, Driver/RefreshDoesNotRevive).
//   - [E3] ErrClosed "means the Locker has been closed" → see C3.
//   - [E4] ErrInvalid "an empty or oversized key, a non-positive TTL" → see L6 and L7. "before any I/O" is
//     not visible on a reachable backend.
//   - [E5] ErrInvalid "a malformed URL, an unknown query parameter" → see D2.
//   - [E6] ErrUnavailable "the backend could not be reached at all" → not checked: needs an unreachable
//     backend, which the Harness cannot stage yet (the fault kit, issue 10); each driver's own tests check it.
//   - [E7] "Package locker treats it as transient while an Acquire waits." → not checked: binds package
//     locker and needs an unreachable backend (root test TestWaitSurvivesTransientErrors).
//   - [E8] "Package locker exports the same values, so errors.Is matches them across the two layers." →
//     Locker/TryAcquire; mutant: held-plain-error.
//
// HeldError:
//
//   - [H1] "returned by Acquire when another owner holds the key and the backend learned, in the same round
//     trip, how long that owner's lock has left" → not checked: round trips are not visible through the
//     interface; that only another owner's hold yields it is A3.
//   - [H2] "Remaining is the holder's remaining TTL as the server saw it: it counts down from the TTL the
//     holder last set." → Driver/HeldError (run when Acquire returns one); mutant: helderror-full-ttl.
//   - [H3] "It wraps ErrNotAcquired." → not checked: package driver implements it, not a driver.
//
// Waiter:
//
//   - [W1] "From the moment Subscribe returns, wake receives a value … each time key may have become free:
//     released" → Driver/Waiter; mutants: waiter-never-wakes, subscribe-registers-late, waiter-wakes-once,
//     waiter-wakes-late.
//   - [W2] "and expired unless the driver's Acquire reports the holder's remaining TTL in a *HeldError" →
//     Driver/WaiterExpiry (woken by the expiry, or told the remaining TTL); mutant: waiter-no-expiry-wake
//     (neither).
//   - [W3] "or deleted" → not checked: through the driver only the owner's Release deletes a key (W1); a
//     deletion behind its back needs the server (the fault kit, issue 10).
//   - [W4] "(it is buffered; sends never block)" → Driver/Waiter; mutant: waiter-unbuffered.
//   - [W5] "A driver that queues subscribers on the server (etcd) may instead wake only the subscriber whose
//     turn it is" → not checked: a permission; each check has one subscriber, whose turn it always is.
//   - [W6] "Spurious wake-ups are allowed; missed ones are not" → see W1, W2; the checks allow spurious ones.
//   - [W7] "except across a lost connection, after which the driver sends one wake-up" → not checked: needs
//     a dropped connection (the fault kit, issue 10).
//   - [W8] "(package locker also retries on a timer, capped at 2s, as a safety net)" → Locker/WokenByRelease
//     (the waiter must be handed the key before that timer could fire); mutant: waiter-never-wakes.
//   - [W9] "cancel ends the subscription and may be called more than once." → Driver/Waiter; mutant:
//     waiter-cancel-noop.
//   - [W10] "Subscribe returns promptly with ctx.Err() once ctx is done." → Driver/Waiter; mutant:
//     subscribe-ignores-ctx.
//
// HoldWatcher:
//
//   - [HW1] "can learn, without being asked, that the server ended a lock it granted before its TTL ran out"
//     → not checked: through the driver only the owner ends a lock before its TTL, and that is not a loss
//     (HW8); a loss behind its back (a deleted key, a killed session) needs the server (the fault kit, issue
//     10, and each driver's own tests).
//   - [HW2] "Package locker watches every lock it holds through it, so that Lost closes within a small bound
//     of the server-side loss" → not checked: needs such a loss (HW1); root test TestHoldWatcherClosesLost.
//   - [HW3] "in the background: it must not wait for a round trip" → not checked: on a reachable backend a
//     round trip is too quick to tell; a cut-off backend (issue 10) shows it.
//   - [HW4] "lost is called at most once" → Driver/HoldWatcherExpiry; mutant: watch-lost-twice.
//   - [HW5] "from any goroutine" → not checked: a freedom of the driver.
//   - [HW6] "with an error wrapping ErrNotHeld" → Driver/HoldWatcherExpiry; mutant: watch-lost-plain-error.
//   - [HW7] "only once the driver knows the server no longer holds key for owner: a false alarm while the
//     lock is held breaks the contract" (a lock kept for several TTLs) → Driver/HoldWatcher; mutant:
//     watch-false-alarm.
//   - [HW8] "only once the driver knows the server no longer holds key for owner" (a lock left to expire:
//     lost, if called, comes after the expiry) → Driver/HoldWatcherExpiry; mutant: watch-early-alarm.
//   - [HW9] "Changes made by owner itself (Refresh, Release, an idempotent Acquire) are not a loss." →
//     Driver/HoldWatcher; mutants: watch-alarm-on-own-change, watch-alarm-on-release.
//   - [HW10] "A watch that breaks (a dropped connection) is re-established and the lock re-checked, not
//     reported as lost unless the check says so." → not checked: needs a dropped connection (the fault kit,
//     issue 10).
//   - [HW11] "stop ends the watch" → not checked: lost may still be called once after stop, so an ended
//     watch cannot be told from a live one from outside.
//   - [HW12] "it may be called more than once and from any goroutine" → Driver/HoldWatcher; mutant:
//     watch-stop-twice-panics.
//   - [HW13] "and must not wait for lost to return" → Driver/HoldWatcherExpiry (when the driver reports the
//     expiry; one that does not cannot break it); mutant: watch-stop-waits-for-lost.
//   - [HW14] "(lost may still be called once after stop; package locker ignores it then)" → not checked:
//     binds package locker (root test TestHoldWatcherClosesLost).
//   - [HW15] "A non-nil error means the grant is not watched; package locker then relies on renewal alone."
//     → not checked: a permission; the HoldWatcher subtests then have nothing to watch.
//
// BlockingAcquirer:
//
//   - [B1] "it blocks on the server until key is granted to owner" (on the holder's release, not before,
//     and promptly) → Driver/BlockingAcquirer; mutants: blocking-grants-while-held, blocking-late.
//   - [B2] "until key is granted to owner" (on the holder's expiry) → Driver/BlockingExpiry; mutant:
//     blocking-no-expiry.
//   - [B3] "AcquireWait is Acquire that waits" (its ttl holds, a short and a long one; the current owner gets
//     its token at once) → Driver/BlockingAcquirer; mutants: blocking-ignores-ttl, blocking-waits-for-self.
//   - [B4] "or ctx is done, in which case it returns an error wrapping ctx.Err() and leaves nothing held or
//     queued" → Driver/BlockingAcquirer; mutants: blocking-ignores-ctx, blocking-stays-queued.
//
// Inspector and Info:
//
//   - [I1] "Inspect returns the current holder of key" (Owner, Token, and a Remaining that "counts down from
//     the TTL the holder last set") → Driver/Inspector; mutant: inspect-wrong-token.
//   - [I2] "or ErrNotHeld if the key is free" (never taken, released) → Driver/Inspector; mutant:
//     inspect-free-not-notheld.
//   - [I3] "or ErrNotHeld if the key is free" (expired) → Driver/Expired; mutant: inspect-sees-expired.
//   - [I4] "It does not change anything." → Driver/Inspector; mutant: inspect-extends.
//
// Capabilities:
//
//   - [K1] "The zero value means: any positive TTL is honoured exactly, and tokens do not survive a restart of
//     the server." → see A7–A10 and K2 (a driver without capabilities is tried with 20ms).
//   - [K2] "MinTTL is the shortest TTL the backend honours." → Driver/Capabilities; mutant:
//     min-ttl-not-honoured.
//   - [K3] "a driver handed a shorter one rounds it up the same way or rejects it with ErrInvalid" →
//     Driver/Capabilities; mutant: honours-below-min.
//   - [K4] "Package locker rounds shorter TTLs up to it." → Locker/TTL (the rounded TTL is the lock's TTL,
//     and holds); mutant: min-ttl-not-honoured.
//   - [K5] "TTLGranularity is the unit TTLs are rounded up to … Zero means the backend keeps any duration." →
//     Driver/Capabilities; mutant: granularity-rounds-down.
//   - [K6] "DurableTokens reports that fencing tokens keep increasing across a restart of the server that
//     loses all its data." → Faults/RestartEmpty (run when the Harness sets RestartEmpty); mutant:
//     empty-restart-resets-tokens.
//   - [K7] "Whatever it declares, a driver's server never frees a lock earlier than ttl − Margin(ttl) after
//     the call that set its ttl was sent." → see A8; every timing check allows the declared margin.
//   - [K8] "Package locker uses Margin, never less than its own default" and Margin's "The holder's Lost
//     closes at the start of the last successful acquire or refresh plus ttl minus Margin(ttl)." →
//     Locker/LostOnExpiry (Deadline, and when Lost closes); mutant: expires-before-margin.
//   - [K9] RoundTTL: "Drivers and package locker use it so that both layers agree on the effective TTL." →
//     see A10, K3, K4.
//
// Pinger:
//
//   - [Pi1] "Ping makes one round trip to the server; it returns nil when the server answered." →
//     Driver/Pinger; mutant: ping-fails. That it is one round trip is not visible.
//
// BatchRefresher:
//
//   - [BR1] "it refreshes the lock it names only if its owner holds it, and otherwise gets ErrNotHeld and
//     changes nothing" and "the batch refreshes exactly the locks it names and whose owners hold them, and
//     nothing else" (another owner's lock, a released lock, a key never taken, and a lock of the same owner
//     the batch does not name) → Driver/BatchRefresh; mutant: batch-foreign-extends.
//   - [BR2] "its ttl counts from the call, replaces the one in force" → Driver/BatchRefresh; mutant:
//     batch-keeps-ttl.
//   - [BR3] "One item's failure never changes another item's outcome", and results come "in the order of
//     items" (an empty key gets ErrInvalid, the rest their own results) → Driver/BatchRefresh; mutant:
//     batch-error-spreads.
//   - [BR4] "A failure of the request as a whole (ctx done, the server unreachable, ErrClosed) is reported
//     on every item it affects" (a done context, a closed Locker) → Driver/BatchRefresh; mutant:
//     batch-ignores-context.
//   - [BR5] "Items naming the same key are refreshed in order." and "An empty batch … makes no request" →
//     not checked: the order of two refreshes of one key by one owner, and a request, are not visible through
//     the interface (that an empty batch returns no results is checked by Driver/BatchRefresh).
//   - [BR6] Package locker: "sends the automatic renewals that fall due together on one Locker through it" →
//     not checked: binds package locker (root tests TestBatchIsolation, TestBatchStallLosesOnTime); the
//     Locker/* subtests renew through it on every driver that has it.
//
// ChangeWatcher (run on a driver that is also a driver.Inspector: each report is followed by an Inspect
// through another Locker, and reports are never matched to changes one for one; a change counts as
// reported when a call of changed that began after the change was sent is followed by a read that finds
// it, within 1s + one unit of the change's return. The keys are election keys, under
// locker.ElectionPrefix, so that PostgreSQL lease mode takes part; a watch of one refused with an error
// matching errors.ErrUnsupported, as PostgreSQL advisory mode and Redlock refuse, leaves nothing to check):
//
//   - [CW1] "From the moment it returns, changed is called each time the holder of key may have changed"
//     (a grant through another Locker made right after WatchChanges returned, before a driver that arms
//     its watch with a first read has read) → Driver/ChangeWatcher; mutant: changes-registers-late.
//   - [CW2] "a grant to an owner that did not hold key" (a key never taken, and a released one) →
//     Driver/ChangeWatcher; mutant: changes-misses-grant.
//   - [CW3] "a release" (through another Locker, the holder's) → Driver/ChangeWatcher; mutant:
//     changes-misses-release.
//   - [CW4] "(a takeover of an expired lock included)", and "An expiry with no other change need not be
//     reported": a lock of one unit left to expire (Inspect then finds it free), then taken by another
//     owner through another Locker; the expiry may be reported or not, the takeover must be →
//     Driver/ChangeWatcher; mutant: changes-misses-takeover (reports a grant of a free key, not one over
//     an expired lock).
//   - [CW5] "Spurious calls are allowed; missed ones are not" → see CW1–CW4; every check reads the key
//     after each report and waits on while it finds an older state.
//   - [CW6] "stop ends the watch, may be called more than once" (twice at once, from two goroutines) and
//     "(changed may still be called once after stop)": changed begins at most once after stop returned,
//     for four changes made after it (a second watch of the key is the barrier) → Driver/ChangeWatcher;
//     mutant: changes-stop-noop.
//   - [CW7] "must not wait for changed to return" (stop while changed is blocked returns within 5s) →
//     Driver/ChangeWatcher; mutant: changes-stop-waits.
//   - [CW8] "never concurrently with itself" → Driver/ChangeWatcher (a call that begins while another
//     runs fails the check); no driver mutant: two overlapping calls show only when a schedule makes them
//     meet, which the suite cannot force, so no mutant fails it every time.
//   - [CW9] L6, L8 and C3 for WatchChanges: an empty key gets ErrInvalid, a cancelled and an expired
//     context their errors, a closed Locker ErrClosed, and none calls changed → Driver/ChangeWatcher;
//     mutants: changes-empty-key-accepted, changes-ignores-ctx, closed-optional-calls-work.
//   - [CW10] "A non-nil error means key is not watched (for example errors.ErrUnsupported where the
//     deployment cannot notify)": on a reachable backend, a watch of a key outside locker.ElectionPrefix
//     reports a grant, or is refused with an error matching errors.ErrUnsupported (PostgreSQL lease mode
//     announces election keys only), never another error → Driver/ChangeWatcher; mutant:
//     changes-refused-plain-error.
//   - [CW11] "except across a lost connection, after which the driver calls changed once it is
//     re-established": a release made right after a Reset of the watcher's Locker is reported within
//     1s + one unit of that Locker's first answer after the Reset, and a grant after it too →
//     Faults/ChangesAcrossReset (run when the Harness sets Reset); mutant: changes-deaf-after-reset.
//   - [CW12] "changed … must return at once and must not call the Locker" and "package locker then relies on
//     reads" → not checked: obligations of the caller (package locker's Observe, root tests
//     TestElectionObserve*).
//
// SharedLocker (semaphores and read-write locks; run only on a driver that implements it and, if it is
// a driver.SharedRefuser, whose SharedUnsupported returns nil):
//
//   - [S1] "never more than Limit holders of a semaphore …, and never a writer together with any other
//     holder of its read-write lock. The check and the grant are one atomic step on the server." →
//     Driver/SharedLimit; mutants: shared-limit-plus-one, shared-write-as-read.
//   - [S2] "Every hold is a lease of its own: … expires on its own, not before its TTL … the other holders
//     keep theirs." → Driver/SharedLeases; mutants: shared-never-expires, shared-release-frees-all.
//   - [S3] "is refreshed and released by its owner only"; RefreshShared and ReleaseShared return ErrNotHeld
//     "and changes nothing" for another owner or mode → Driver/SharedOwnership; mutant:
//     shared-release-any-owner.
//   - [S4] "every grant carries a token strictly greater than every earlier grant's for that key (a permit,
//     a read or a write): across release, expiry" → Driver/SharedTokens; mutant: shared-tokens-per-locker.
//   - [S5] "once a SharedWrite request waits, SharedRead requests that arrive after it are not granted
//     before it …; the writer is granted once the holds in force when it arrived have been released" →
//     Driver/SharedWriterPreference; mutant: shared-writer-polls.
//   - [S6] "a request by an owner that holds the same lock in the same mode succeeds … and returns the same
//     token. There are no upgrades or downgrades: … fails with ErrInvalid at once" →
//     Driver/SharedIdempotent; mutants: shared-not-idempotent, shared-upgrade-waits.
//   - [S7] "a SharedPermit Limit outside 1..MaxSharedLimit, is ErrInvalid", an invalid mode, an empty key,
//     a non-positive ttl, nothing held afterwards → Driver/SharedBadInput; mutant: shared-limit-unchecked.
//   - [S8] SharedRequest.Limit: "the grant is made only while fewer than Limit owners hold the key. It is
//     per request" → Driver/SharedPerCallLimit; mutant: shared-limit-max-seen.
//   - [S9] SharedMode: "A mutex (Locker), a semaphore (SharedPermit) and a read-write lock (SharedRead,
//     SharedWrite) on the same key string are three different locks" → Driver/SharedNamespaces; mutant:
//     shared-namespace-mutex.
//   - [S10] "a release or an expiry grants, or wakes, the waiters that can now be granted" → Driver/SharedWakeups;
//     mutant: shared-wait-polls. FIFO order among waiters is not observable from outside without timing
//     assumptions; drivers/mem TestSharedFIFO checks the reference implementation's.
//   - [S11] SharedRequest.Wait: "A request that ends with ctx leaves nothing held and nothing queued" →
//     Driver/SharedContext; mutant: shared-cancel-stays-queued.
//   - [S12] Package locker: Semaphore and RWMutex on a driver without SharedLocker "fail before any I/O with
//     an error matching errors.ErrUnsupported" → not checked: binds package locker, not a driver (root test
//     TestSemaphoreBadInput).
//   - [S13] Semaphore and RWMutex through package locker under contention (32 Lockers, a semaphore of 4 and
//     a read-write lock): never more than 4 permit holders, never a writer beside anyone, tokens above those
//     of the holds released before each request → Locker/SharedContention; mutants: shared-limit-plus-one,
//     shared-write-as-read.
//
// Package locker's promises on top of the driver, checked through locker.New (a broken root is caught
// by the root's own tests; these rows show that the driver cannot make the root break them):
//
//   - [X1] Lock.Lost: "It closes before the server can grant the key to anyone else when the lock ends by
//     its TTL" → Locker/LostOnExpiry; mutant: expires-before-margin.
//   - [X2] Locker.Do: "fn's context is cancelled the moment the lock is lost (context.Cause then wraps
//     ErrNotHeld)" → Locker/DoCancelledOnLoss; no driver mutant: package locker closes Lost at its own
//     deadline whatever the driver does, so only a broken root fails it (this subtest, run on the mem driver,
//     is the root's only check).
//   - [X3] Locker.Close: "releases every lock still held through this Locker …, makes waiting Acquire calls
//     return ErrClosed" → Locker/Close; mutant: release-noop.
//   - [X4] WithAutoRenew: "the lock is refreshed every TTL/3 while held" → Locker/AutoRenew; mutant:
//     refresh-noop.
//   - [X5] Locker.Acquire: "Waiting does not poll where the driver can do better" → Locker/WokenByRelease;
//     mutants: waiter-storm, blocking-late.
//   - [X6] Locker.Acquire: "A failed or cancelled Acquire leaves nothing held." → Locker/CancelledWait;
//     mutant: blocking-stays-queued.
//   - [X7] Lock.Refresh: "It returns ErrNotHeld once the lock is released or lost (and then Lost is closed)"
//     → Locker/RefreshAfterLoss; no driver mutant: package locker presumes the lock lost at its safe
//     deadline, before another owner can take it, and answers without asking the driver (root test
//     TestLostWhenServerSaysNotHeld).
//   - [X8] Lock.Token: "strictly greater than the token of every earlier grant of the same key" →
//     Locker/Fencing; mutant: tokens-reset-on-release.
//   - [X9] mutual exclusion under contention (8 Lockers, never two holders at once) → Locker/Contention;
//     mutant: acquire-ignores-holder.
//   - [X10] Locker.TryAcquire: "ErrInvalid for an empty key or a bad option (before any I/O)" →
//     Locker/BadInput; no driver mutant: package locker rejects them before calling the driver, so only a
//     broken root fails it (this subtest, run on the mem driver, is the root's check).
//   - [X11] Locker.Close: it "returns once nothing of it touches the backend any more", calls it cut short
//     "return an error matching ErrClosed, never ErrUnavailable", and "no grant made before or during Close
//     outlives it on the server" (Close racing Release, Acquire, TryAcquire, Do and a queued Acquire) →
//     Locker/CloseRaces; mutant: blocking-stays-queued (a wait Close cut short stays queued on the server and
//     takes the key later). The rest is package locker's obligation: it tracks the calls in flight and
//     closes the driver last (root test TestCloseIsABarrier).
//   - [X12] WithMaxHold: "The bound counts from the grant on every way of waiting", after a wait of more
//     than a second → Locker/MaxHoldFromGrant; no driver mutant: package locker's obligation, counted on its
//     own clock from when the winning call returned, so a driver that answers late only lengthens the bound
//     (root test TestMaxHoldCountsFromGrant).
//
// Leader election (package locker's Election over the driver, through locker.New; run on a driver that is
// a driver.Inspector). Each mutant breaks an election's lock only (keys under locker.ElectionPrefix), so
// that only these checks can see it:
//
//   - [EL1] "At most one leader at a time": three candidates Lead one election and resign after short terms;
//     when a leader's fn starts, no other leader's fn context is still open; it contends until it has seen 3
//     terms, for at most 10 windows of 500ms → Locker/ElectionOneLeader; mutant: election-two-leaders.
//   - [EL2] "Terms fence": a term is strictly greater than every earlier term, across a resign and across a
//     leader's expiry, and Leader reports it → Locker/ElectionTerms; mutant: election-terms-repeat.
//   - [EL3] "No phantom leader": a leader whose lease runs out (renewal off) has its fn's context cancelled
//     before another candidate's Campaign returns; its Lead is stopped once it has lost, so that it cannot
//     win again first → Locker/ElectionNoPhantom; mutant: election-frees-early (the server forgets the lock
//     half way through its TTL and tells no one).
//   - [EL4] "The leader's value is visible": any bytes (printable ASCII only where the driver declares
//     Capabilities.OwnerASCII), up to Election.MaxValue (which Capabilities.MaxOwner lowers), as given, through
//     another Locker → Locker/ElectionValue; mutant: election-value-truncated (Inspect keeps 64 bytes of an
//     owner and the driver declares no MaxOwner).
//   - [EL5] Observe "yields the current leader (or none) at once, then every change of leader": each new
//     leader with its value and term, and each resign, within 1s → Locker/ElectionObserve; mutant:
//     election-inspect-stale.
//   - [EL6] Observe "never yields a term lower than one it has yielded", and one leader never shows under two
//     terms → Locker/ElectionObserve; no driver mutant: package locker drops a lower term whatever Inspect
//     says, so only a broken root fails it (this subtest, run on the mem driver, is the root's check).
//   - [EL7] "Resign is fast": after Release, or fn returning an error from Lead (which Lead returns), the
//     waiting candidate is elected within 1s (run on a driver with a Waiter or a BlockingAcquirer) →
//     Locker/ElectionResign; mutant: election-release-noop.
//   - [EL8] "Bad input gets ErrInvalid": an empty name (Campaign, Lead, Leader, Observe), WithOwner, TTL 0, a
//     value one byte over Election.MaxValue, a value not printable ASCII where the driver declares OwnerASCII;
//     nothing is held afterwards; Lead with a nil fn panics → Locker/ElectionBadInput; no driver mutant:
//     package locker rejects them before calling the driver, from the Capabilities the driver declares
//     (whether a declared limit is the real one is EL4's check).
//
// Under faults (the fault subtests below):
//
//   - [F1] Lock.Lost "closes before the server can grant the key to anyone else", with a holder cut off
//     from the server → Faults/Cut; mutants: frees-on-cut, lost-late. The first grants the key to others
//     while the cut-off holder's lock is still valid; the second ends the lock half way through the TTL the
//     holder counts on, which is what a root that fires Lost late looks like from outside (the suite
//     cannot swap the root).
//   - [F2] The same, with the holder's connections reset → Faults/Reset; no driver mutant: the flaws of F1
//     show the same way here, and F1 proves the check.
//   - [F3] The same, across a server restart that keeps its data → Faults/Restart; no driver mutant: as F2.
//   - [F4] Lock.Token "strictly greater than the token of every earlier grant of the same key", across a
//     restart that loses the server's data → see K6.
//   - [F5] A paused holder: the server does not grant the key before the holder's safe deadline, and the
//     holder's Lost closes at once when it resumes → Faults/Pause; no driver mutant: a driver that frees
//     early fails F1 the same way, and the flawed driver's state lives in one process, which a child cannot
//     share.
//   - [F6] Elections under the same faults: every contender's Locker also Leads one election; never two
//     leaders whose fn contexts are open at once for longer than the Harness's LostBound, and terms in
//     real-time order → Faults/Cut (and every other fault subtest); mutant: election-frees-on-cut (the server
//     frees the election lock of a Locker cut off, and tells no one).
//   - [F17] Shared holds under the same faults: every contender's Locker also takes permits of a semaphore
//     of 2 and read or write holds of a read-write lock; never more than 2 permit holders, nor a writer
//     beside another holder, believing they hold at once for longer than the Harness's LostBound; tokens
//     of each lock in real-time order; the fenced register never accepts a write made after a later
//     grant's write; both locks free at the end → Faults/Cut (and every other fault subtest, on a
//     driver.SharedLocker); mutant: shared-frees-on-cut (the server frees the shared holds of a Locker cut
//     off, and tells no one).
//
// Directed faults (rows F7–F16; each stages one fault at the moment it matters, on its own short schedule, not the
// random histories' FaultTimeEnv, and checks one obligation; see "Directed fault subtests" below):
//
//   - [F7] A reply lost under a cut: a TryAcquire of a free key through a Locker cut off, with a 300ms
//     context, must not report ErrNotAcquired (the key was free: the reply was lost, not refused), and once
//     the 1s cut heals, package locker's clean-up frees whatever the server granted within 5s + 2 units, far
//     inside the grant's TTL of at least 30s → Faults/LostReply; mutants: lost-reply-not-acquired,
//     tcp-lost-reply-not-acquired (the server grants, the driver reports ErrNotAcquired, so nothing cleans
//     the grant up; the second on the TCP reference driver, through a real cut).
//   - [F8] Inspect after a restart that keeps the data reports the same holder and token, and the holder's
//     Refresh succeeds (where Capabilities.LockerBound, the lock may end with its session, and then Inspect
//     must agree with an Acquire by another owner) → Faults/InspectAfterRestart; mutants:
//     restart-renumbers-tokens, tcp-restart-renumbers-tokens.
//   - [F9] Inspect after a restart that loses the data reports no stale holder: what it reports agrees with
//     whether another owner can then take the key → Faults/InspectAfterRestartEmpty; mutants:
//     inspect-ghost-after-empty-restart, tcp-inspect-ghost-after-empty-restart (Inspect reads a copy the
//     restart did not empty).
//   - [F10] The server agrees with the believers: a Reset of a Locker that holds nothing (it released the key,
//     then another Locker took it) changes no key's holder once it has reconnected; after a Reset of the
//     holder, a Refresh that succeeds is matched by Inspect (same owner and token), and one that reports
//     ErrNotHeld is not contradicted by it → Faults/ServerAgrees; mutants: reset-reasserts,
//     tcp-reset-reasserts (the client re-acquires, on reconnect, a key it released).
//   - [F11] A HoldWatcher whose connections are reset while the server keeps the lock reports no loss
//     within 1s of the holder's next successful round trip (a loss reported while Inspect still shows the
//     grant is a false alarm) → Faults/WatchAcrossReset; mutant: watch-alarm-on-reset.
//   - [F12] After a restart that loses the lock (Inspect then shows it gone), the HoldWatcher reports the
//     loss within 1s of the restart hook's return; where the lock survives (a quorum of servers), it
//     reports nothing → Faults/WatchRestartEmpty; mutant: watch-misses-empty-restart.
//   - [F13] Waits survive reconnects: a Waiter subscribed under a holder with a TTL of at least 30s, whose
//     connection a fault breaks, is woken by the holder's release within 1s, not at the TTL, and the key
//     is then free to the waiter's Locker (wake-ups before the release are drained: a driver sends one
//     after a lost connection); since that one wake-up may come late and pass for the release's, the
//     holder takes the key again, the Waiter must stay silent in one of three 300ms windows while the key
//     is held and untouched, and a second release must wake it within 1s too. With a Reset of the
//     waiter's Locker → Faults/WaitAcrossReset; mutants: waiter-deaf-after-reset,
//     tcp-waiter-deaf-after-reset, tcp-waiter-deaf-wakes-late (the TCP client never re-subscribes; the
//     second sends its one post-reconnect wake-up 300ms late, so that it lands after the first release,
//     which the first check alone took for the release's). Limit: a Waiter that wakes on a timer slower
//     than 300ms, or only after a release plus a delay, cannot be told from one that hears releases; the
//     1s bound is what limits it.
//   - [F14] The same across a server restart that keeps the data → Faults/WaitAcrossRestart; mutants:
//     waiter-deaf-after-restart, tcp-waiter-deaf-after-restart (the server acknowledges and drops the
//     subscriptions made in the first 5s after a restart).
//   - [F15] A Refresh through a Locker cut off from the server, with a shorter and with a longer TTL and a
//     300ms context, returns before the heal with an error, never success (no reply could have come
//     back); after the heal the holder's Refresh succeeds (where Capabilities.LockerBound, the session the
//     cut-short calls ended may have taken the lock with it) → Faults/RefreshUnderCut; mutant:
//     refresh-ok-on-timeout, tcp-refresh-ok-on-timeout.
//   - [F16] A holder cut off while the server restarts without its data, after which another owner takes
//     the key, gets ErrNotHeld from its first Refresh after the heal and leaves the new holder's lock alone
//     (where the lock survives the restart, a quorum of servers, its Refresh succeeds) →
//     Faults/RestartWhileCut; mutant: heal-reasserts (the client re-acquires, on reconnect, what it believes
//     it holds).
//
// # Fault subtests
//
// A driver's test stages the faults it can through the Harness's hooks
// (Cut, Reset, Restart, RestartEmpty, Pause); Run then runs one subtest per
// hook set, named Faults/<hook>, one at a time after all the others.
// Proxied builds Open, Cut and Reset for a TCP backend on the fault proxy of
// package faultproxy: every Locker reaches the servers through proxies of
// its own. Each fault subtest runs three Lockers (separate "processes")
// that take turns holding one key for a bounded time (FaultTimeEnv; 8 units
// and at least 2s by default, and on, up to four times as long, until the
// key and the shared track have each been granted once), while the fault
// is injected at random moments,
// aimed at the current holder where it has one. A holder, while it believes
// it holds the key, writes its token to a fenced register every unit/10;
// every operation records when it started and ended, and every grant when
// its holder stopped believing it held it (Lost closed, Release called, or
// its safe deadline passed). Faults/Pause runs the holder in a child process
// (the same test binary; see Harness.Pause) and stops it with SIGSTOP for
// two TTLs.
//
// The check then fails the subtest on any of:
//
//   - two grants whose holders both believed they held the key at the same time, for longer than the
//     Harness's LostBound for that fault: the earlier holder's Lost closed after the later one was granted
//     (the interval counted is from the later grant's return to the earlier of the two belief ends, so a
//     slow machine can only hide an overlap, never invent one);
//   - a token not strictly greater than that of a grant whose Acquire returned before this one's began (a
//     real-time order check of the token sequence: a linearizability check of the counter), except across
//     RestartEmpty for a driver whose Capabilities.DurableTokens is false;
//   - the key still held after every contender stopped and the last TTL ran out;
//   - in Faults/Pause, a child whose Lost did not close within 1s of resuming;
//   - in the election track (row F6), two leaders whose fns both had their context open, each stamping the
//     time every unit/20 before checking it, for longer than LostBound after the later one's fn started; or
//     a term not strictly greater than a term whose fn started before the campaign that won it began;
//   - in the shared track (row F17, on a driver.SharedLocker), three permit holders of the semaphore of 2,
//     or a writer and another holder of the read-write lock, all believing they hold for longer than
//     LostBound after the last of them was granted; a token of either lock out of real-time order (as
//     above); the fenced register of the writers accepting a write made after the write of a grant that
//     began after the writer's own grant had returned; either lock still held once every contender
//     stopped and the last TTL ran out; or no shared hold granted at all.
//
// Cut and Reset aim in turn at the key's holder, the election's leader and a shared holder (a writer
// first). Each subtest also logs "election-track: fault=… terms=… violations=…" and "shared-track:
// fault=… permits=… reads=… writes=… violations=… stale_rejected=… register_writes=…".
//
// # Directed fault subtests
//
// Beside the random histories, Run runs one directed subtest per row F7–F16
// whose hook the Harness sets and whose interfaces the driver has (Inspector;
// HoldWatcher for F11 and F12; Waiter for F13 and F14), also one at a time
// under Faults/: LostReply (Cut), RefreshUnderCut (Cut), RestartWhileCut
// (Cut and RestartEmpty), InspectAfterRestart (Restart),
// InspectAfterRestartEmpty (RestartEmpty), ServerAgrees (Reset),
// WatchAcrossReset (Reset), WatchRestartEmpty (RestartEmpty),
// WaitAcrossReset (Reset), WaitAcrossRestart (Restart), and ChangesAcrossReset (Reset; row CW11, on a
// driver.ChangeWatcher). Each makes raw driver calls (LostReply
// goes through package locker, whose clean-up it checks), stages its fault
// between two of them, and retries a call that fails to reach the backend
// for up to 30s after the fault. A backend that cannot meet one declares it
// in Harness.Cannot ("Faults/WatchRestartEmpty").
//
// The fenced register replays every write in the order written and rejects a
// token lower than one it accepted; since tokens follow real-time order
// (above), what it rejects are writes of holders that had lost the key
// without knowing, which fencing exists to stop. Each subtest logs one line,
// "fault-matrix: fault=… violations=… margin_min=… margin_p50=…
// takeover_p50=… takeover_p99=… ops=… stale_rejected=…": margin is the time
// from a holder's loss to the next grant (negative: an overlap), takeover the
// time from a fault aimed at a holder to the next grant to anyone. scripts/faults
// gathers these lines into the failure-mode matrix of docs/failure-modes.md.
package conformance
