package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"os/signal"
	"syscall"
	"time"

	"github.com/go-locker/locker"
)

// releaseTimeout bounds the release when the command has exited.
const releaseTimeout = 5 * time.Second

// forwarded are the signals locker passes on to the command. While it waits
// for the lock, the first four end the wait instead (exit code 128+N).
var forwarded = []os.Signal{syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT, syscall.SIGUSR1, syscall.SIGUSR2}

// waitFlag is --wait: a duration, 0 for one attempt, or "forever".
type waitFlag struct{ d time.Duration } // d < 0: forever

func (w *waitFlag) String() string {
	if w.d < 0 {
		return "forever"
	}
	return w.d.String()
}

func (w *waitFlag) Set(s string) error {
	if s == "forever" || s == "inf" {
		w.d = -1
		return nil
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return errors.New("want a duration such as 0, 30s or 5m, or forever")
	}
	if d < 0 {
		return errors.New("must not be negative (0 tries once; forever waits without limit)")
	}
	w.d = d
	return nil
}

// graceFlag is --grace: a duration, or unset for defaultGrace of the TTL.
type graceFlag struct {
	d   time.Duration
	set bool
}

func (g *graceFlag) String() string {
	if !g.set {
		return "TTL/4, at most 10s"
	}
	return g.d.String()
}

func (g *graceFlag) Set(s string) error {
	d, err := time.ParseDuration(s)
	if err != nil {
		return errors.New("want a duration such as 500ms or 5s")
	}
	g.d, g.set = d, true
	return nil
}

// maxDefaultGrace caps the default --grace.
const maxDefaultGrace = 10 * time.Second

// defaultGrace is --grace when it is not given: a quarter of the TTL, at
// most 10s. With renewal every TTL/3 and the safe deadline at TTL minus the
// drift margin, renewals that fail still get from TTL/3 to about 3/4 TTL to
// succeed before the command is told to stop.
func defaultGrace(ttl time.Duration) time.Duration { return min(ttl/4, maxDefaultGrace) }

type runOpts struct {
	common
	ttl     time.Duration
	wait    waitFlag
	onLost  string
	grace   graceFlag
	maxHold time.Duration
	minHold time.Duration
	limit   limitFlag // --limit: a semaphore permit (limit.go)
	key     string
	command []string
	elect   string // --elect VALUE
	elected bool   // --elect was given

	// Set once the lock is granted.
	holdBound time.Time // --max-hold: when package locker ends the lock; zero without
	minUntil  time.Time // --min-hold: the key stays taken until then; zero without
}

func cmdRun(args []string, stdout, stderr io.Writer) int {
	o := runOpts{wait: waitFlag{-1}}
	fs := newFlags("run", stderr, &o.common)
	fs.DurationVar(&o.ttl, "ttl", locker.DefaultTTL, "lock TTL: how long the lock outlives locker if it dies; renewed every TTL/3")
	fs.Var(&o.wait, "wait", "how long to wait for the lock: 0 tries once, `D` waits up to D, forever waits without limit")
	fs.StringVar(&o.onLost, "on-lost", "term", "what to do to the command's process group when the lock is being lost: `term` (SIGTERM --grace before the safe deadline, SIGKILL at it), kill (SIGKILL at the deadline) or ignore")
	fs.Var(&o.grace, "grace", "with --on-lost=term, how long before the lock's safe deadline SIGTERM goes out when renewals fail (`D` < TTL/2)")
	fs.DurationVar(&o.maxHold, "max-hold", 0, "stop the job and release the lock `D` after the grant however long the command runs (0: no bound); with --on-lost=term SIGTERM goes --grace (at most D/2) before, SIGKILL at D")
	fs.DurationVar(&o.minHold, "min-hold", 0, "keep the key taken until `D` after the grant even if the command ends sooner (0: release at once); for cron fleets whose clocks differ")
	fs.Var(&o.limit, "limit", limitUsage)
	fs.Func("elect", "run the command only while leading the election `KEY` (the lock's key names the election), campaigning with VALUE; on a loss stop it and campaign again", func(v string) error {
		o.elect, o.elected = v, true
		return nil
	})
	if code, ok := o.parse(fs, args, stdout); !ok {
		return code
	}
	if o.elected {
		return o.runElect()
	}
	return o.run()
}

// parse reads "[flags] KEY [flags] -- COMMAND [ARGS...]". ok false means
// exit with code.
func (o *runOpts) parse(fs *flag.FlagSet, args []string, stdout io.Writer) (code int, ok bool) {
	usage := func(format string, a ...any) (int, bool) {
		o.errorf("run: "+format+" (usage: locker run [flags] KEY -- COMMAND [ARGS...]; see locker run -h)", a...)
		return exitUsage, false
	}
	fs.Usage = func() {}
	out := fs.Output()
	fs.SetOutput(io.Discard)
	defer fs.SetOutput(out)
	parse := func(args []string) (int, bool) {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				fs.SetOutput(stdout)
				fmt.Fprintln(stdout, "usage: locker run [flags] KEY -- COMMAND [ARGS...]")
				fs.PrintDefaults()
				return exitOK, false
			}
			return usage("%v", err)
		}
		return 0, true
	}
	if code, ok := parse(args); !ok {
		return code, false
	}
	rest := fs.Args()
	if len(rest) == 0 {
		return usage("missing KEY")
	}
	o.key = rest[0]
	rest = rest[1:]
	// Flags may also follow KEY; then "--" must end them.
	if code, ok := parse(rest); !ok {
		return code, false
	}
	remaining := fs.Args()
	consumed := rest[:len(rest)-len(remaining)]
	if len(consumed) == 0 || consumed[len(consumed)-1] != "--" {
		return usage("missing -- between KEY and COMMAND")
	}
	o.command = remaining
	switch {
	case o.key == "":
		return usage("empty KEY")
	case len(o.command) == 0 || o.command[0] == "":
		return usage("missing COMMAND after --")
	case o.ttl <= 0:
		return usage("--ttl must be positive, got %v", o.ttl)
	case o.onLost != "term" && o.onLost != "kill" && o.onLost != "ignore":
		return usage("--on-lost must be term, kill or ignore, got %q", o.onLost)
	case o.grace.d < 0:
		return usage("--grace must not be negative, got %v", o.grace.d)
	case o.grace.set && o.grace.d >= o.ttl/2:
		return usage("--grace %v does not fit --ttl %v: SIGTERM goes out --grace before the lock's safe deadline, so --grace must be under half the TTL (renewal runs every TTL/3)", o.grace.d, o.ttl)
	case o.maxHold < 0:
		return usage("--max-hold must not be negative, got %v", o.maxHold)
	case o.minHold < 0:
		return usage("--min-hold must not be negative, got %v", o.minHold)
	case o.maxHold > 0 && o.minHold > o.maxHold:
		return usage("--min-hold %v is longer than --max-hold %v", o.minHold, o.maxHold)
	}
	if o.elected {
		if msg := electConflict(fs, o); msg != "" {
			return usage("%s", msg)
		}
	}
	if !o.grace.set {
		o.grace.d = defaultGrace(o.ttl)
	}
	return 0, true
}

// electConflict names a flag given with --elect that does not apply to an
// election ("" if none): --min-hold (a leader that stops resigns at once),
// --wait (a candidate campaigns until elected or interrupted) and --limit
// (an election has one leader).
func electConflict(fs *flag.FlagSet, o *runOpts) string {
	wait := false
	fs.Visit(func(f *flag.Flag) { wait = wait || f.Name == "wait" })
	switch {
	case o.minHold > 0:
		return "--min-hold does not apply with --elect: a leader that stops resigns at once"
	case wait:
		return "--wait does not apply with --elect: a candidate campaigns until it is elected or interrupted"
	case o.limit.set:
		return "--limit does not apply with --elect: an election has one leader"
	}
	return ""
}

func (o *runOpts) run() int {
	// Find the command before taking the lock: a typo must not hold it.
	path, err := exec.LookPath(o.command[0])
	if err != nil {
		o.errorf("run: command %q: %v", o.command[0], unwrapExec(err))
		if errors.Is(err, exec.ErrNotFound) || errors.Is(err, fs.ErrNotExist) {
			return exitNotFound
		}
		return exitCannotRun
	}

	// Catch signals from now on, so that none arriving while the lock is
	// being taken can leave it held.
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, forwarded...)
	defer signal.Stop(sigs)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var gotSig os.Signal
	stopWatch := make(chan struct{})
	watchDone := make(chan struct{})
	go func() { // while acquiring: a terminating signal cancels
		defer close(watchDone)
		for {
			select {
			case s := <-sigs:
				if s == syscall.SIGUSR1 || s == syscall.SIGUSR2 {
					continue
				}
				gotSig = s
				cancel()
				return
			case <-stopWatch:
				return
			}
		}
	}()
	lk, l, code := o.acquire(ctx)
	close(stopWatch)
	<-watchDone
	if lk == nil {
		if gotSig != nil {
			o.errorf("run: interrupted by %v while taking %q", gotSig, o.key)
			code = 128 + int(gotSig.(syscall.Signal))
		}
		if l != nil {
			l.Close()
		}
		return code
	}
	defer l.Close()
	if gotSig != nil { // arrived just as the lock was granted
		o.errorf("run: interrupted by %v while taking %q", gotSig, o.key)
		o.release(lk)
		return 128 + int(gotSig.(syscall.Signal))
	}
	code = o.supervise(lk, path, sigs)
	o.holdSession(l, sigs)
	return code
}

// acquire opens the backend and takes the lock. On failure it returns a
// nil Lock and the exit code.
func (o *runOpts) acquire(ctx context.Context) (*locker.Lock, *locker.Locker, int) {
	l, err := o.open(ctx)
	if err != nil {
		if ctx.Err() != nil {
			return nil, nil, exitUsage
		}
		o.errorf("run: %v", err)
		return nil, nil, failCode(err)
	}
	opts := []locker.Option{locker.WithTTL(o.ttl), locker.WithMaxHold(o.maxHold), locker.WithMinHold(o.minHold)}
	lk, err := o.tryAcquire(ctx, l, opts)
	if errors.Is(err, locker.ErrNotAcquired) && o.wait.d != 0 {
		o.logWaiting(ctx, l)
		wctx := ctx
		if o.wait.d > 0 {
			var cancel context.CancelFunc
			wctx, cancel = context.WithTimeout(ctx, o.wait.d)
			defer cancel()
		}
		lk, err = o.acquireWait(wctx, l, opts)
		if err != nil && ctx.Err() == nil && wctx.Err() != nil {
			// The wait ran out: held, unless the backend cannot be reached
			// now (retries while waiting are not always in the error).
			if failCode(err) == exitUnavailable {
				o.errorf("run: %v", err)
				return nil, l, exitUnavailable
			}
			pctx, cancel := context.WithTimeout(ctx, pingTimeout)
			perr := l.Ping(pctx)
			cancel()
			if perr != nil && ctx.Err() == nil {
				o.errorf("run: waited %v for %q; the backend is not reachable: %v", o.wait.d, o.key, perr)
				if errors.Is(perr, context.DeadlineExceeded) {
					return nil, l, exitUnavailable
				}
				return nil, l, failCode(perr)
			}
			o.errorf("run: %q is still held after waiting %v", o.key, o.wait.d)
			return nil, l, exitNotAcquired
		}
	}
	switch {
	case err == nil:
		o.logf("acquired %q: token %d, ttl %v", o.key, lk.Token(), lk.TTL())
		o.granted(lk, l)
		return lk, l, exitOK
	case ctx.Err() != nil:
		return nil, l, exitUsage // interrupted; the caller reports the signal
	case errors.Is(err, locker.ErrNotAcquired):
		o.errorf("run: %q is held by another owner", o.key)
		return nil, l, exitNotAcquired
	default:
		o.errorf("run: %v", err)
		return nil, l, failCode(err)
	}
}

// granted records the hold bounds of a lock just granted. Package locker
// counts --max-hold from lk.Granted (the end of the call that won the
// lock, however long it waited), so the job is stopped at the same moment
// the library ends the lock. --min-hold counts from after the grant, so
// the bound here is no earlier than the library's.
func (o *runOpts) granted(lk *locker.Lock, l *locker.Locker) {
	if o.minHold > 0 {
		o.minUntil = time.Now().Add(o.minHold)
	}
	if o.maxHold > 0 {
		o.holdBound = lk.Granted().Add(o.maxHold)
	}
}

// holdSession keeps the backend session open until --min-hold's bound
// where locks end with the session (driver.Capabilities.LockerBound), so
// that the key stays taken until then. A terminating signal cuts it short.
func (o *runOpts) holdSession(l *locker.Locker, sigs <-chan os.Signal) {
	left := time.Until(o.minUntil)
	if o.minUntil.IsZero() || left <= 0 || !l.Capabilities().LockerBound {
		return
	}
	o.logf("keeping the session open %v, until --min-hold's bound", left.Round(time.Millisecond))
	t := time.NewTimer(left)
	defer t.Stop()
	for {
		select {
		case <-t.C:
			return
		case s := <-sigs:
			if s == syscall.SIGUSR1 || s == syscall.SIGUSR2 || s == syscall.SIGTSTP {
				continue
			}
			o.errorf("run: %v: ending the session before --min-hold's bound; %q is free now", s, o.key)
			return
		}
	}
}

// release releases lk and reports whether it had been lost meanwhile.
func (o *runOpts) release(lk *locker.Lock) (lost bool) {
	ctx, cancel := context.WithTimeout(context.Background(), releaseTimeout)
	defer cancel()
	err := lk.Release(ctx)
	switch {
	case err == nil:
		o.logf("released %q", o.key)
	case errors.Is(err, locker.ErrNotHeld):
		o.errorf("run: lock %q was lost while the command ran", o.key)
		return true
	default:
		o.errorf("run: release failed, the lock expires after its TTL: %v", err)
	}
	return false
}

// unwrapExec drops exec's repetition of the command name.
func unwrapExec(err error) error {
	var ee *exec.Error
	if errors.As(err, &ee) {
		err = ee.Err
	}
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}
