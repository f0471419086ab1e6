// Command locker runs a program under a distributed lock or only while it
// leads an election, shows who holds a lock or leads, and benchmarks a lock
// backend.
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
// renews the lock every TTL/3 while it runs, and releases it when it and the
// processes it started in its process group have exited,
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
//	--on-lost MODE   what to do to the command's process group when the lock
//	                 is being lost (see "Loss" below): term (default), kill
//	                 or ignore
//	--grace D        with --on-lost term, how long before the lock's safe
//	                 deadline SIGTERM goes out while renewals fail; default
//	                 TTL/4, at most 10s; must be under TTL/2
//	--max-hold D     stop the job and release the lock D after the grant,
//	                 however long the command runs (default 0: no bound);
//	                 see "Max and min hold" below
//	--min-hold D     keep the key taken until D after the grant even if the
//	                 command ends sooner (default 0: release at once)
//	--limit N        let at most N runs hold KEY at once: take one of the N
//	                 permits of the semaphore KEY (a lock apart from the
//	                 mutex KEY) instead of the lock; N from 1 to 1024, else
//	                 exit 125 before any I/O. Every driver has semaphores
//	                 except Redis Redlock, where --limit exits 125
//	                 saying so
//	-v               say what locker is doing, on stderr
//
// The command is looked up before the lock is taken, so a typo never holds
// it.
//
// # The job
//
// The command runs in a process group of its own, and everything it starts
// in that group is part of the job: SIGINT, SIGTERM, SIGHUP, SIGQUIT,
// SIGUSR1, SIGUSR2 and SIGTSTP sent to locker are forwarded to the whole
// group, and locker releases the lock and exits only when the command and
// every other process of its group have exited (a process meant to outlive
// the lock must leave the group, with setsid for instance). Locker adopts
// the job's orphans (PR_SET_CHILD_SUBREAPER) and reaps them. Run from a
// terminal, in its foreground, locker hands the terminal to the job's group,
// so the command can read it and Ctrl-C and Ctrl-Z reach it directly; when
// the job stops (Ctrl-Z, or a terminal read from the background) locker
// stops the whole group and itself, like a shell job, and continues the
// group (with the terminal, if it has it) when it is continued. Before the
// lock is granted, SIGINT, SIGTERM, SIGHUP and SIGQUIT end the wait and
// leave nothing held.
//
// # Loss
//
// The lock has a safe deadline (locker.Lock.Deadline): the start of the last
// successful renewal plus the TTL minus a drift margin, before the backend
// can grant the key to anyone else. Renewal every TTL/3 moves it forward.
// While renewals fail the deadline stands still, and with --on-lost term
// the job's process group gets SIGTERM once the deadline is --grace away
// and SIGKILL at the deadline, so that a job that exits on SIGTERM within
// --grace, and any job at all, is gone before another owner can be
// granted the key (tested with a grandchild that ignores SIGTERM behind sh,
// against a Redis server stopped with SIGSTOP). With kill, SIGKILL goes at
// the deadline; with ignore, nothing is sent. If the backend says the lock
// is gone before the deadline (a renewal finds another owner, the key was
// deleted), another owner may hold it already: the group gets SIGKILL at
// once, with term too. A locker that was itself stopped (SIGSTOP, a VM
// pause) past the deadline kills the group at once when it runs again; no
// lock can stop the job while locker is stopped, which is what fencing
// tokens are for; nor can it if locker is killed (SIGKILL), after which the
// lock expires after its TTL. If a renewal succeeds after SIGTERM was sent, the lock
// stays held until the job ends and is then released, and the exit code is
// still 123.
//
// # Max and min hold
//
// --max-hold bounds a stuck job (locker.WithMaxHold): renewal stops D after
// the grant and the lock is released then, whether or not its renewals
// were failing. As at a safe deadline, with --on-lost term the job's
// process group gets SIGTERM --grace before the bound (at most D/2 before)
// and SIGKILL at it; with kill, SIGKILL at the bound; with ignore the job
// runs on without the lock. locker exits 123. Both --max-hold and
// --min-hold count from the grant (locker.Lock.Granted), never from the
// start of a wait for the lock.
//
// --min-hold is for cron fleets (locker.WithMinHold): a release before D
// after the grant leaves the key taken, by nobody's work, until then, when
// it expires. A job that finished in 2s on one host is not run again by a
// host whose cron fires 3s later because its clock is 3s behind:
//
//	*/5 * * * *  locker run --url redis://lockhost:6379 --wait 0 --min-hold 1m report -- ./report.sh
//
// runs report.sh once per 5-minute slot across hosts whose clocks differ by
// less than a minute. The other hosts exit 124. Where a lock ends with its
// backend session (PostgreSQL advisory locks), locker keeps the session,
// and does not exit, until the bound. Bad values (negative, a min hold
// longer than the max hold, not a duration) are usage errors (125),
// reported before the backend is opened.
//
// # locker run --elect
//
//	locker run --elect VALUE [flags] KEY -- COMMAND [ARGS...]
//
// runs COMMAND only while this locker leads the election KEY
// (locker.Locker.Election; its lock is the key locker/election/KEY),
// campaigning with VALUE, which locker leader shows. LOCKER_TOKEN is the
// term: larger for every leader of KEY. When the lead is being lost, the
// job is stopped as for a lost lock (see "Loss") and locker campaigns
// again rather than exiting. When the command exits on its own, locker
// resigns and exits with its code. A forwarded signal (SIGTERM, ...) while
// leading goes to the job; once the job has exited locker resigns, so the
// next candidate is elected at once, and returns the job's exit code. A
// terminating signal N while campaigning exits 128+N. --max-hold bounds
// each term; --min-hold, --wait and --limit with --elect are usage errors
// (125).
//
// # Exit codes
//
//	0-255   the command's own exit code (128+N if it was killed by signal N)
//	122     the backend could not be reached (an error matching
//	        locker.ErrUnavailable, a network error or a connection the
//	        server closed, or no answer within
//	        10s when it is opened); a key held by someone else is 124
//	123     the lock was lost, renewals failed up to --grace before its
//	        deadline, or --max-hold was reached, while the command ran
//	        (the job was stopped as --on-lost says; with ignore, it ran to
//	        its end)
//	124     the lock was not acquired: held by another owner with --wait 0,
//	        or still held when --wait ran out
//	125     usage or configuration error: bad flag or argument, missing --,
//	        empty KEY, bad TTL, malformed URL, unknown scheme or query
//	        parameter, or a backend that fails otherwise
//	126     the command was found but could not be started
//	127     the command was not found
//	128+N   locker was stopped by signal N while waiting for the lock, or
//	        while campaigning with --elect
//
// With --elect a lost lead is not an exit: the job is stopped and locker
// campaigns again.
//
// locker itself is quiet unless -v is given; each error is one line on
// stderr, starting with "locker: ".
//
// # locker status
//
//	locker status [--url URL] [-o text|json] [--limit N] KEY
//
// prints the holder (its owner string), the fencing token and the remaining
// TTL of KEY and exits 0, or prints that KEY is free and exits 1. It exits
// 122 when the backend cannot be reached, and 125 on other errors,
// including a backend that cannot report the holder. Flags may also follow
// KEY.
//
// With -o json it prints one JSON object on one line instead, whatever
// happens once the arguments are valid, with the same exit codes. Its
// field names are stable:
//
//	key           string  KEY
//	reachable     bool    whether the backend answered
//	held          bool    whether KEY is held; absent if that could not be told
//	holder        string  the holder's owner string    } only when
//	token         number  its fencing token            } held is
//	remaining_ms  number  its TTL left, in whole ms    } true
//	error         string  what went wrong, if anything
//
// For example
//
//	{"key":"job","reachable":true,"held":true,"holder":"5f0e…","token":42,"remaining_ms":29417}
//	{"key":"job","reachable":false,"error":"open: redis: 127.0.0.1:6379: ROLE: server unreachable: …"}
//
// With --limit N it shows the semaphore KEY of N permits instead (N as for
// locker run): every holder with its token and remaining TTL, exit 0 when
// any permit is held and 1 when none is. Its JSON has, in place of holder,
// token and remaining_ms, the fields limit (N) and holders, a list of
// objects with those three fields.
//
// # locker leader
//
//	locker leader [--url URL] [-o text|json] [--watch] KEY
//
// prints the leader of the election KEY (its value, term and remaining
// TTL) and exits 0, or prints that nobody leads and exits 1. It exits 122
// when the backend cannot be reached, and 125 on other errors, including a
// backend that cannot report who holds a lock. With --watch it prints the
// leader, then one line for every change (a new term, or nobody), until
// SIGINT, SIGTERM or SIGHUP, and then exits 0. With -o json each line is
// one JSON object with stable field names:
//
//	election      string  KEY
//	leader        bool    whether someone leads; absent if that could not be told
//	value         string  the leader's VALUE        } only when
//	term          number  its term                  } leader is
//	remaining_ms  number  its TTL left, in whole ms } true
//	error         string  what went wrong, if anything
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
// exits 1 if there were violations, 122 when the backend cannot be reached,
// 125 on usage errors.
//
// # locker drivers
//
// lists the URL schemes this build of locker can use.
package main
