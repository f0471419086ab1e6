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
// holding one line: a format version, the fencing token, the expiry (Unix
// nanoseconds on the wall clock), the owner and the key, quoted. Every
// Acquire, Refresh and Release is a read-modify-write of that file under an
// exclusive flock(2), held only for those few system calls, so Acquire is
// atomic across processes. A lease is in force while its expiry is in the
// future: a holder that crashes or stops renewing loses the key after its TTL
// exactly as on a server, and a Refresh or Release by anyone but the holder
// of a lease in force returns driver.ErrNotHeld and changes nothing. Release
// removes the file. The flock is taken with non-blocking attempts and a short
// backoff (20µs to 2ms), so a process stopped while holding it cannot block
// others beyond their context.
//
// Fencing tokens come from the directory's counter file, "tokens", bumped
// under its own flock at each grant: token = max(previous + 1, wall clock in
// microseconds). Tokens therefore strictly increase for every key, across
// release, expiry and re-acquire, also when the clock steps back, and also
// when the counter file is lost (a tmpfs emptied at reboot), since the
// clock has moved past every earlier token. They look like timestamps.
//
// Waiting needs no polling: Subscribe (driver.Waiter) watches the directory
// with inotify(7), so a release wakes waiters in every process at once, and
// keeps a timer at the current lease's expiry for a holder that died. One
// inotify instance serves all subscriptions of a process on a directory; if
// inotify cannot be had, subscriptions re-read the lock file every 50ms.
//
// # Limits
//
//   - One host only. The directory must be on a local file system: flock and
//     inotify do not work across hosts on NFS or other network file systems.
//     For locks across hosts use a server backend, with the same code and
//     another URL.
//   - Expiry is judged on the wall clock, which all processes on one host
//     share. A wall clock step forward by more than the remaining TTL ends
//     leases early; a step back lengthens them. Holders' own loss detection in
//     package locker uses the monotonic clock and is not affected.
//   - The lock file of a holder that crashed stays until the key is acquired
//     again (the file is reused) or a Refresh or Release call on the key finds
//     the lease expired (the file is removed); each is under 300 bytes plus the
//     key. The token counter file stays.
//   - Keys up to MaxKeyLen bytes, owners up to MaxOwnerLen bytes; two keys
//     whose hashes collide (160 bits) would be detected and reported, not
//     confused.
//   - Everyone who can write the directory can break locks by editing or
//     removing files; keep it private (the default) or group-owned.
package file
