// Command locker runs a program under a distributed lock, shows who holds a
// lock, and benchmarks a lock backend.
//
// Install it from a checkout with
//
//	go install ./cmd/locker
//
// # locker run
//
//	locker run [flags] KEY -- COMMAND [ARGS...]
//
// takes the lock KEY, runs COMMAND with its standard input, output and error,
// renews the lock every TTL/3 while it runs, and releases it when it exits,
// so that only one copy of the command runs at a time wherever locker runs
// against the same backend:
//
//	locker run nightly-backup -- ./backup.sh                      # one host, no server
//	LOCKER_URL=redis://lockhost:6379 locker run nightly-backup -- ./backup.sh   # any host
//
// The command gets LOCKER_KEY (the key) and LOCKER_TOKEN (the fencing token:
// larger for every grant of the key; pass it to the resource you protect so
// it can reject a holder that lost the lock) in its environment. Flags, which
// may come before or after KEY:
//
//	--url URL        backend URL; default $LOCKER_URL, else file:// (the file
//	                 driver's default directory: lock files on this host)
//	--ttl D          lock TTL, default 30s: how long the lock outlives a locker
//	                 that dies without releasing it
//	--wait D         how long to wait while another holder has the lock:
//	                 0 tries once, forever (the default) waits without limit
//	--on-lost MODE   what to do to the command if the lock is lost while it runs
//	                 (a renewal found it gone, or renewals failed past the safe
//	                 deadline): term (default) sends SIGTERM, then SIGKILL after
//	                 --grace; kill sends SIGKILL; ignore lets it run
//	--grace D        time between SIGTERM and SIGKILL with --on-lost=term,
//	                 default 10s
//	-v               say what locker is doing, on stderr
//
// The command is looked up before the lock is taken, so a typo never holds
// it. SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1 and SIGUSR2 sent to locker are
// forwarded to the command, and locker exits when the command does, releasing
// the lock. (SIGINT and SIGQUIT from a terminal reach the command directly,
// since it shares locker's process group, and are not sent twice.) Before the
// lock is granted, SIGINT, SIGTERM, SIGHUP and SIGQUIT end the wait and leave
// nothing held.
//
// # Exit codes
//
//	0-255   the command's own exit code (128+N if it was killed by signal N)
//	123     the lock was lost while the command ran (the command was
//	        stopped as --on-lost says; with ignore, it ran to its end)
//	124     the lock was not acquired: held by another owner with --wait 0,
//	        or still held when --wait ran out
//	125     usage or configuration error: bad flag or argument, missing --,
//	        empty KEY, bad TTL, malformed URL, unknown scheme or query
//	        parameter, or a backend that cannot be reached or fails
//	126     the command was found but could not be started
//	127     the command was not found
//	128+N   locker was stopped by signal N while waiting for the lock
//
// locker itself is quiet unless -v is given; each error is one line on
// stderr, starting with "locker: ".
//
// # locker status
//
//	locker status [--url URL] KEY
//
// prints the holder (its owner string), the fencing token and the remaining
// TTL of KEY and exits 0, or prints that KEY is free and exits 1. It exits 125
// on errors, including a backend that cannot report the holder.
//
// # locker bench
//
//	locker bench [--url URL] [--workers N] [--duration D] [--hold H] [--ttl D] [--key KEY]
//
// runs N workers (default 4), each with its own connection to the backend,
// contending for one key for D (default 5s), holding it for H (default 0)
// each time. While measuring it checks mutual exclusion (an overlap detector
// across the workers) and that every grant's token is larger than the one
// before. It prints acquire latency (from the call to the grant) and handoff
// latency (from one holder's release to the next holder's grant, for grants
// that had to wait) as p50/p99/max, the throughput, and any violations; it
// exits 1 if there were violations, 125 on usage errors.
//
// # locker drivers
//
// lists the URL schemes this build of locker can use.
package main
