// Package file is the locker driver for one host: leases kept in lock files
// in a directory, shared by every process that opens the same directory. It
// needs no server, and is what the locker command uses when no URL is given.
//
// Import it for its side effect, and open a Locker by URL:
//
//	import _ "github.com/go-locker/locker/drivers/file"
//
//	l, err := locker.OpenURL("file://")              // the default directory
//	l, err := locker.OpenURL("file:///var/lock/app") // a directory of your own
//
// As every driver of this module (see docs/writing-a-driver.md), the
// package has two constructors: Open takes a URL, and New takes the
// directory itself (an absolute path; "" means DefaultDir(), and a relative
// path is an error wrapping driver.ErrInvalid), with an Options (nil means
// the defaults: Perm DefaultPerm, 0600, like the perm parameter):
//
//	d, err := file.Open(ctx, "file:///var/lock/app")
//	d, err := file.New(ctx, "/var/lock/app", nil)
//	l := locker.New(d)
//
// # URL
//
//	file://[localhost]/ABSOLUTE/DIR[?perm=0600]
//	file://                       the default directory, DefaultDir()
//
// The directory is created if missing. "file://" means os.TempDir()/locker-<uid>
// (usually /tmp/locker-<uid>): the same for every process of the user, whether
// it runs from a shell, cron or a systemd unit; it must belong to the user and
// not be writable by others, or Open fails. A host other than localhost, user
// information, a relative path or any other query parameter is an error
// wrapping driver.ErrInvalid.
//
// Query parameters:
//
//   - perm: octal permission bits of the lock files and of a directory that
//     Open creates (plus the matching search bits), between 0600 and 0666.
//     Default 0600, so only the user's processes exclude each other; use
//     0660 and a group-owned directory to share locks between users of one
//     group. The umask applies when files are created.
//
// # How it works
//
// Each key has a lock file, Dir()/<first 160 bits of SHA-256(key) in hex>.lck,
// holding one line: a format version, the fencing token, the boot id, the
// expiry, the owner and the key, quoted. Every Acquire, Refresh and Release
// is a read-modify-write of that file under an exclusive flock(2), held only
// for those few system calls, so Acquire is atomic across processes. A lease
// is in force while its expiry is in the future: a holder that crashes or
// stops renewing loses the key after its TTL exactly as on a server, and a
// Refresh or Release by anyone but the holder of a lease in force returns
// driver.ErrNotHeld and changes nothing. Release rewrites the record with no
// owner, keeping its token. The flock is taken with non-blocking attempts
// and a short backoff (20µs to 2ms), so a process stopped while holding it
// cannot block others beyond their context.
//
// Expiry is on CLOCK_MONOTONIC, with the boot id
// (/proc/sys/kernel/random/boot_id) in the record: wall-clock steps, in
// either direction, neither end a lease early nor lengthen it, and a record
// written during an earlier boot has expired. CLOCK_MONOTONIC rather than
// CLOCK_BOOTTIME because it is the clock Go's timers, and so the holders'
// safe deadlines, run on: neither counts the time the host spends suspended.
//
// Fencing tokens come from the directory's counter file, "tokens", bumped
// under its own flock at each grant: token = max(counter + 1, last token
// recorded for the key + 1, wall clock in microseconds). Tokens therefore
// strictly increase for every key, across release, expiry and re-acquire;
// when the clock steps back; when the counter file is lost (the key's record
// keeps its last token, released or expired); and when the whole directory
// is lost (a tmpfs emptied at reboot), since the clock has moved past every
// earlier token, unless the clock also stepped back across that loss.
// They look like timestamps.
//
// Waiting needs no polling: Subscribe (driver.Waiter) watches the directory
// with inotify(7), so a release wakes a mutex's waiters in every process at
// once (every waiter: they then race for the key, unqueued), and
// keeps a timer at the current lease's expiry for a holder that died. One
// inotify instance serves all subscriptions of a process on a directory; if
// inotify cannot be had, subscriptions re-read the lock file every 50ms.
//
// The same inotify watch serves WatchHold (driver.HoldWatcher): when a held
// key's lock file is removed, or rewritten with another owner or another
// grant, by a process that broke or took the lease, the holder's Lost closes
// at once. Every alarm is confirmed by re-reading the record under its
// flock, and the holder's own refreshes and release raise none.
// Without inotify, grants are not watched and renewal finds the loss.
//
// It also serves WatchChanges (driver.ChangeWatcher), so that an election's
// observers (Election.Observe) hear each grant and release by any process
// at once; without inotify they are told every 50ms.
//
// # Semaphores and read-write locks
//
// The Locker implements driver.SharedLocker. The semaphore on a key and the
// read-write lock on it each have a file of their own, Dir()/<hash of
// key>.sem and .rw, apart from the key's mutex (.lck): three locks. The file
// holds one line per holder (owner, mode, token, expiry on CLOCK_MONOTONIC
// with the boot id, as for a mutex) and one per waiting request (owner,
// mode, limit, TTL), in arrival order. Every operation is one
// read-modify-write of it under its flock, so the check of the limit and
// the grant are one atomic step across processes. Each holder is a lease
// of its own: it expires after its TTL whether its process lives or not,
// and the others keep theirs. Tokens come from the directory's counter, as
// for mutexes, floored at the highest token the file ever granted.
//
// A request is granted at once only if no request waits ahead of it and it
// fits beside the holders: a permit while fewer than its own limit hold, a
// read while no writer holds, a write while nobody holds. Otherwise a
// one-shot request fails with driver.ErrNotAcquired, and a waiting one is
// queued. Whoever next rewrites the file (a release, a refresh, an
// acquire, a waiter) first drops the expired holders, then grants the
// queue from its head for as long as the head fits: a run of readers, one
// writer, or permits while they last. So a waiting writer blocks the reads
// that come after it, and is granted once the holds in force at its
// arrival end; waiters are served in arrival order.
//
// A release wakes only the waiters it concerns, not every waiter: nobody
// watches the lock's file itself. The write that grants a waiter, or that
// makes one the head of the queue, writes a byte to that waiter's own
// waiter file once the record is written, and inotify reports it to that
// waiter alone, which then reads the record under a shared flock. The
// waiter at the head also keeps a timer at the first holder's expiry
// (which changes no file) and settles the file itself when it fires.
// Every other waiter watches only the waiter file of the live entry ahead
// of it, for its closing: a waiting process closes its waiter file when
// its wait ends, however it ends. So the flock attempts per grant do not
// grow with the number of waiters (see docs/benchmarks.md). Without
// inotify every waiter re-reads the file every 50ms; with it, a waiter
// that heard nothing for a second re-reads it anyway.
//
// A waiting request holds an exclusive flock on a waiter file of its own,
// <lock file>.<id>.wait, named in its queue entry and opened read-only. A
// process that dies while waiting releases that flock and closes the file;
// the waiter behind it hears of the closing, finds the flock free, and
// settles the record if the dead entry is at the head (which drops it), or
// else watches the entry ahead of the dead one. Any settle drops a dead
// entry that reaches the head. So a dead waiter does not block the queue,
// and in particular a dead waiting writer does not shut out readers. A
// wait whose context ends removes its entry and its waiter file, or undoes
// its grant if one was made meanwhile, and wakes the waiter that was
// behind it.
//
// Why not flock(2) LOCK_SH and LOCK_EX, or n slot files: a flock lasts as
// long as its process, where a hold must be a lease that ends after its TTL
// even while its process lives, be renewed or released from another
// Locker by its owner, and carry a token; and n slot files cannot check a
// per-request limit (a request for 2 permits must see every holder, not 2
// slots) nor queue writers ahead of later readers. flock keeps its place
// as the short mutual exclusion of each read-modify-write, and as the
// liveness signal of waiters.
//
// # Limits
//
//   - One host only. The directory must be on a local file system: flock and
//     inotify do not work across hosts on NFS or other network file systems.
//     For locks across hosts use a server backend, with the same code and
//     another URL.
//   - A key's lock file stays after Release, holding the key's last token
//     (under 300 bytes plus the key), so that the next token can be floored
//     by it; so do the files of semaphores and read-write locks, and the
//     token counter file. A waiter file of a process that died while
//     waiting stays until the waiter behind it, or a settle that reaches
//     it, finds it dead. Remove the files of keys no
//     longer used only while no process uses them.
//   - The record format changed (version 2: monotonic expiry and boot id).
//     Version 1 records are still read and honoured on the wall clock until
//     rewritten, but earlier versions of this driver cannot read version 2:
//     do not share a directory between processes of both.
//   - Processes in different time namespaces (CLONE_NEWTIME) must not share
//     a directory: their monotonic clocks differ.
//   - Keys up to MaxKeyLen bytes, owners up to MaxOwnerLen bytes; two keys
//     whose hashes collide (160 bits) would be detected and reported, not
//     confused.
//   - Everyone who can write the directory can break locks by editing or
//     removing files; keep it private (the default) or group-owned.
package file
