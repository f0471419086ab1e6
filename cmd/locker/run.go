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
	"strconv"
	"syscall"
	"time"

	"github.com/go-locker/locker"
	"golang.org/x/sys/unix"
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

type runOpts struct {
	common
	ttl     time.Duration
	wait    waitFlag
	onLost  string
	grace   time.Duration
	key     string
	command []string
}

func cmdRun(args []string, stdout, stderr io.Writer) int {
	o := runOpts{wait: waitFlag{-1}}
	fs := newFlags("run", stderr, &o.common)
	fs.DurationVar(&o.ttl, "ttl", locker.DefaultTTL, "lock TTL: how long the lock outlives locker if it dies; renewed every TTL/3")
	fs.Var(&o.wait, "wait", "how long to wait for the lock: 0 tries once, `D` waits up to D, forever waits without limit")
	fs.StringVar(&o.onLost, "on-lost", "term", "what to do to the command if the lock is lost: `term` (SIGTERM, SIGKILL after --grace), kill (SIGKILL) or ignore")
	fs.DurationVar(&o.grace, "grace", 10*time.Second, "with --on-lost=term, how long after SIGTERM to send SIGKILL")
	if code, ok := o.parse(fs, args, stdout); !ok {
		return code
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
	case o.grace < 0:
		return usage("--grace must not be negative, got %v", o.grace)
	}
	return 0, true
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
	return o.supervise(l, lk, path, sigs)
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
		return nil, nil, exitUsage
	}
	opts := []locker.Option{locker.WithTTL(o.ttl)}
	lk, err := l.TryAcquire(ctx, o.key, opts...)
	if errors.Is(err, locker.ErrNotAcquired) && o.wait.d != 0 {
		if in, ierr := l.Inspect(ctx, o.key); ierr == nil {
			o.logf("waiting for %q (held with token %d, expires in %v)", o.key, in.Token, in.Remaining.Round(time.Millisecond))
		} else {
			o.logf("waiting for %q", o.key)
		}
		wctx := ctx
		if o.wait.d > 0 {
			var cancel context.CancelFunc
			wctx, cancel = context.WithTimeout(ctx, o.wait.d)
			defer cancel()
		}
		lk, err = l.Acquire(wctx, o.key, opts...)
		if err != nil && ctx.Err() == nil && wctx.Err() != nil {
			o.errorf("run: %q is still held after waiting %v", o.key, o.wait.d)
			return nil, l, exitNotAcquired
		}
	}
	switch {
	case err == nil:
		o.logf("acquired %q: token %d, ttl %v", o.key, lk.Token(), lk.TTL())
		return lk, l, exitOK
	case ctx.Err() != nil:
		return nil, l, exitUsage // interrupted; the caller reports the signal
	case errors.Is(err, locker.ErrNotAcquired):
		o.errorf("run: %q is held by another owner", o.key)
		return nil, l, exitNotAcquired
	default:
		o.errorf("run: %v", err)
		return nil, l, exitUsage
	}
}

// supervise runs the command while holding lk and returns the exit code.
func (o *runOpts) supervise(l *locker.Locker, lk *locker.Lock, path string, sigs chan os.Signal) int {
	cmd := exec.Command(path, o.command[1:]...)
	cmd.Args[0] = o.command[0]
	cmd.Env = append(os.Environ(),
		"LOCKER_TOKEN="+strconv.FormatUint(lk.Token(), 10),
		"LOCKER_KEY="+o.key)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	if err := cmd.Start(); err != nil {
		o.errorf("run: cannot start %q: %v", o.command[0], unwrapExec(err))
		o.release(lk)
		return exitCannotRun
	}
	o.logf("started %q, pid %d", o.command[0], cmd.Process.Pid)
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()

	ttyGroup := inForegroundGroup()
	lostCh := lk.Lost()
	lost := false
	var killAt <-chan time.Time
	var waitErr error
loop:
	for {
		select {
		case waitErr = <-done:
			break loop
		case s := <-sigs:
			if ttyGroup && (s == syscall.SIGINT || s == syscall.SIGQUIT) {
				// The terminal sent it to the whole process group,
				// the command included; do not deliver it twice.
				continue
			}
			o.logf("forwarding %v to pid %d", s, cmd.Process.Pid)
			_ = cmd.Process.Signal(s)
		case <-lostCh:
			lostCh, lost = nil, true
			switch o.onLost {
			case "term":
				o.errorf("run: lock %q lost while the command ran; sending SIGTERM (SIGKILL in %v)", o.key, o.grace)
				_ = cmd.Process.Signal(syscall.SIGTERM)
				killAt = time.After(o.grace)
			case "kill":
				o.errorf("run: lock %q lost while the command ran; sending SIGKILL", o.key)
				_ = cmd.Process.Kill()
			default:
				o.errorf("run: lock %q lost while the command ran; letting it run (--on-lost=ignore)", o.key)
			}
		case <-killAt:
			killAt = nil
			o.logf("grace period over: sending SIGKILL to pid %d", cmd.Process.Pid)
			_ = cmd.Process.Kill()
		}
	}
	code := exitCode(cmd.ProcessState, waitErr)
	o.logf("command exited with code %d", code)
	if !lost {
		select {
		case <-lk.Lost():
			lost = true
			o.errorf("run: lock %q was lost while the command ran", o.key)
		default:
			lost = o.release(lk)
		}
	}
	if lost {
		return exitLost
	}
	return code
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

func exitCode(ps *os.ProcessState, err error) int {
	if ps == nil {
		return exitCannotRun
	}
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	return ps.ExitCode()
}

// inForegroundGroup reports whether locker runs in the foreground process
// group of the terminal on stdin, where a Ctrl-C reaches the command too.
func inForegroundGroup() bool {
	pgrp, err := unix.IoctlGetInt(0, unix.TIOCGPGRP)
	return err == nil && pgrp == unix.Getpgrp()
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
