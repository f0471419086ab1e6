package main

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/go-locker/locker"
)

// electRetry is how long locker run --elect waits before campaigning again
// after the backend failed.
const electRetry = time.Second

// runElect is locker run --elect VALUE: it campaigns in the election KEY
// with VALUE, runs the command while it leads (LOCKER_TOKEN is the term),
// and when the lead is lost stops the job as run does and campaigns
// again. It returns when the command exits on its own (its exit code; the
// lead is resigned first), or on a terminating signal: while campaigning,
// 128+N; while leading, the signal goes to the job, and once the job has
// exited the lead is resigned and the command's exit code returned.
func (o *runOpts) runElect() int {
	path, err := exec.LookPath(o.command[0])
	if err != nil {
		o.errorf("run: command %q: %v", o.command[0], unwrapExec(err))
		if errors.Is(err, exec.ErrNotFound) || errors.Is(err, fs.ErrNotExist) {
			return exitNotFound
		}
		return exitCannotRun
	}
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, forwarded...)
	defer signal.Stop(sigs)
	l, sig, err := interruptible(sigs, func(ctx context.Context) (*locker.Locker, error) { return o.open(ctx) })
	if sig != nil {
		return o.interrupted(sig)
	}
	if err != nil {
		o.errorf("run: %v", err)
		return failCode(err)
	}
	defer l.Close()
	e := l.Election(o.key)
	opts := []locker.Option{locker.WithTTL(o.ttl), locker.WithMaxHold(o.maxHold)}
	for {
		lk, code := o.campaign(e, sigs, opts)
		if lk == nil {
			return code
		}
		o.logf("elected in %q with %q: term %d, ttl %v", o.key, o.elect, lk.Token(), lk.TTL())
		o.granted(lk, l)
		code, term := o.lead(lk, path, sigs)
		switch {
		case term:
			return code
		case code == exitLost:
			o.errorf("run: lost the lead of %q (term %d); campaigning again", o.key, lk.Token())
		default:
			return code
		}
	}
}

// campaign waits until elected. On failure it returns a nil Lock and the
// exit code: 128+N on a terminating signal, exitUsage for an election that
// cannot succeed. A backend that fails is retried every electRetry.
func (o *runOpts) campaign(e *locker.Election, sigs chan os.Signal, opts []locker.Option) (*locker.Lock, int) {
	for {
		lk, sig, err := interruptible(sigs, func(ctx context.Context) (*locker.Lock, error) {
			return e.Campaign(ctx, o.elect, opts...)
		})
		switch {
		case sig != nil:
			return nil, o.interrupted(sig)
		case err == nil:
			return lk, exitOK
		case errors.Is(err, locker.ErrInvalid), errors.Is(err, errors.ErrUnsupported), errors.Is(err, locker.ErrClosed):
			o.errorf("run: %v", err)
			return nil, exitUsage
		}
		o.errorf("run: campaign: %v; trying again in %v", err, electRetry)
		if _, sig, _ := interruptible(sigs, func(ctx context.Context) (struct{}, error) {
			t := time.NewTimer(electRetry)
			defer t.Stop()
			select {
			case <-t.C:
			case <-ctx.Done():
			}
			return struct{}{}, nil
		}); sig != nil {
			return nil, o.interrupted(sig)
		}
	}
}

func (o *runOpts) interrupted(sig os.Signal) int {
	o.errorf("run: interrupted by %v while campaigning in %q", sig, o.key)
	return 128 + int(sig.(syscall.Signal))
}

// interruptible runs f with a context that a terminating signal on sigs
// cancels, and returns that signal. USR1 and USR2 are ignored meanwhile.
func interruptible[T any](sigs chan os.Signal, f func(ctx context.Context) (T, error)) (T, os.Signal, error) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var got os.Signal
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			select {
			case s := <-sigs:
				if s == syscall.SIGUSR1 || s == syscall.SIGUSR2 {
					continue
				}
				got = s
				cancel()
				return
			case <-done:
				return
			}
		}
	})
	v, err := f(ctx)
	close(done)
	wg.Wait()
	return v, got, err
}

// lead runs the job for one term (supervise: it stops the job when the
// lead is being lost, and resigns when it exits). term reports that a
// terminating signal arrived meanwhile (it was forwarded to the job).
func (o *runOpts) lead(lk *locker.Lock, path string, sigs chan os.Signal) (code int, term bool) {
	proxy := make(chan os.Signal, 8)
	defer signal.Stop(proxy)
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			select {
			case s := <-sigs:
				if s != syscall.SIGUSR1 && s != syscall.SIGUSR2 {
					term = true
				}
				select {
				case proxy <- s:
				case <-done:
					return
				}
			case <-done:
				return
			}
		}
	})
	code = o.supervise(lk, path, proxy)
	close(done)
	wg.Wait()
	if term {
		o.logf("resigned the lead of %q on a signal", o.key)
	}
	return code, term
}
