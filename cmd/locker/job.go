package main

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/go-locker/locker"
	"golang.org/x/sys/unix"
)

// The job is the command locker runs under the lock together with every
// process it starts in its process group. The command gets a process group
// of its own, so that signals, and the stop on loss, reach the whole job;
// locker waits for the whole group before it releases the lock.

// killLead is how long before the safe deadline SIGKILL goes out: a
// millisecond, so that it is sent before the owner-checked release that
// package locker sends at the deadline can free the key.
const killLead = time.Millisecond

// leftoverPoll bounds how long a process group that empties without locker
// reaping its last member goes unnoticed.
const leftoverPoll = 100 * time.Millisecond

// job supervises the running command; only its run loop touches it.
type job struct {
	o   *runOpts
	lk  *locker.Lock
	pid int  // the command's pid, which is also its process group id
	tty bool // stdin is a terminal

	termSent bool // SIGTERM sent: renewals failed to within --grace of the deadline
	killSent bool // SIGKILL sent: the deadline came, or the lock was lost
	lost     bool // Lost closed
	timer    *time.Timer
}

// supervise runs the command while holding lk and returns locker's exit
// code.
func (o *runOpts) supervise(lk *locker.Lock, path string, sigs chan os.Signal) int {
	// Adopt the orphans of the job, so that its processes are reaped, and
	// its group seen empty, whatever pid 1 does.
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		o.logf("cannot adopt the command's orphans: %v", err)
	}
	signal.Notify(sigs, syscall.SIGTSTP)
	j := &job{o: o, lk: lk, tty: isTerminal(0)}
	cmd := exec.Command(path, o.command[1:]...)
	cmd.Args[0] = o.command[0]
	cmd.Env = append(os.Environ(),
		"LOCKER_TOKEN="+strconv.FormatUint(lk.Token(), 10),
		"LOCKER_KEY="+o.key)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	// The group gets the terminal if locker has it, as a shell's job would.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Foreground: j.tty && inForegroundGroup(), Ctty: 0}
	if err := cmd.Start(); err != nil {
		o.errorf("run: cannot start %q: %v", o.command[0], unwrapExec(err))
		o.release(lk)
		return exitCannotRun
	}
	j.pid = cmd.Process.Pid
	o.logf("started %q, pid %d, in process group %d", o.command[0], j.pid, j.pid)
	reaps := make(chan reaped, 16)
	go reap(reaps)
	code, stoppedForLoss := j.run(reaps, sigs)
	j.restoreTerminal()
	if j.lost {
		return exitLost
	}
	select {
	case <-lk.Lost():
		o.errorf("run: lock %q was lost while the command ran", o.key)
		return exitLost
	default:
	}
	if o.release(lk) || stoppedForLoss {
		return exitLost
	}
	return code
}

// run supervises the job until the command has exited and its process
// group is empty. It returns the command's exit code, and whether the job
// was stopped because the lock was being lost.
func (j *job) run(reaps chan reaped, sigs <-chan os.Signal) (code int, stoppedForLoss bool) {
	j.timer = time.NewTimer(time.Hour)
	defer j.timer.Stop()
	j.check()
	lostCh := j.lk.Lost()
	exited, empty := false, false
	var poll <-chan time.Time
	var ticker *time.Ticker
	defer func() {
		if ticker != nil {
			ticker.Stop()
		}
	}()
	for !exited || !empty {
		select {
		case r := <-reaps:
			if r.err != nil { // no child left at all
				reaps, exited, empty = nil, true, true
				continue
			}
			if r.pid == j.pid {
				switch {
				case r.ws.Stopped():
					j.stopped(r.ws.StopSignal())
				case r.ws.Exited(), r.ws.Signaled():
					exited, code = true, exitCode(r.ws)
					j.o.logf("command exited with code %d", code)
				}
			}
			if exited && !empty {
				if empty = !j.groupAlive(); !empty && poll == nil {
					j.o.logf("waiting for the rest of process group %d", j.pid)
					ticker = time.NewTicker(leftoverPoll)
					poll = ticker.C
				}
			}
		case <-poll:
			empty = !j.groupAlive()
		case s := <-sigs:
			j.o.logf("forwarding %v to process group %d", s, j.pid)
			j.signal(s.(syscall.Signal))
		case <-lostCh:
			lostCh = nil
			j.onLost()
		case <-j.timer.C:
			j.check()
		}
	}
	return code, j.termSent || j.killSent
}

// check acts on the time left before the lock ends, and arms the timer for
// the next moment that matters. The lock ends at the earlier of its safe
// deadline (which renewals move forward) and --max-hold's bound, where
// package locker releases it. SIGTERM goes --grace before the deadline, or
// --grace (at most half of --max-hold) before the bound; SIGKILL goes
// killLead before either. A moment that has passed (locker was paused, or
// renewals failed) gets SIGKILL at once.
func (j *job) check() {
	select {
	case <-j.lk.Lost():
		j.onLost()
		return
	default:
	}
	if j.o.onLost == "ignore" || j.killSent {
		return
	}
	now := time.Now()
	deadline := j.lk.Deadline()
	killAt, termAt := deadline.Add(-killLead), deadline.Add(-j.o.grace.d)
	killWhy := "no renewal before its safe deadline"
	termWhy := fmt.Sprintf("renewals of lock %q are failing, %v before its safe deadline", j.o.key, deadline.Sub(now).Round(time.Millisecond))
	if b := j.o.holdBound; !b.IsZero() {
		if k := b.Add(-killLead); k.Before(killAt) {
			killAt, killWhy = k, fmt.Sprintf("--max-hold %v reached; the lock is being released", j.o.maxHold)
		}
		if t := b.Add(-min(j.o.grace.d, j.o.maxHold/2)); t.Before(termAt) {
			termAt = t
			termWhy = fmt.Sprintf("--max-hold %v of lock %q ends in %v", j.o.maxHold, j.o.key, b.Sub(now).Round(time.Millisecond))
		}
	}
	if !now.Before(killAt) {
		j.kill(killWhy)
		return
	}
	term := j.o.onLost == "term"
	if term && !j.termSent && !now.Before(termAt) {
		j.termSent = true
		j.o.errorf("run: %s; sending SIGTERM to the command's process group (SIGKILL at the end)", termWhy)
		j.signal(syscall.SIGTERM)
	}
	next := killAt
	if term && !j.termSent {
		next = termAt
	}
	j.timer.Reset(next.Sub(now))
}

// onLost handles the closing of Lost. At --max-hold's bound package locker
// releases the lock: the job is killed (it should have been by check
// already). Before the deadline it means the backend said the lock is gone,
// so another owner may hold it already: SIGKILL at once, --on-lost term
// included.
func (j *job) onLost() {
	if j.lost {
		return
	}
	j.lost = true
	maxHold := errors.Is(j.lk.Err(), locker.CauseMaxHold)
	switch {
	case j.o.onLost == "ignore" && maxHold:
		j.o.errorf("run: --max-hold %v of lock %q reached and the lock released; letting the command run (--on-lost=ignore)", j.o.maxHold, j.o.key)
	case j.o.onLost == "ignore":
		j.o.errorf("run: lock %q lost while the command ran; letting it run (--on-lost=ignore)", j.o.key)
	case j.killSent:
	case maxHold:
		j.kill(fmt.Sprintf("--max-hold %v reached; the lock is being released", j.o.maxHold))
	case time.Until(j.lk.Deadline()) > killLead:
		j.kill("the backend says it is gone; another owner may hold it")
	default:
		j.kill("no renewal before its safe deadline")
	}
}

func (j *job) kill(why string) {
	j.killSent = true
	j.o.errorf("run: lock %q lost while the command ran (%s); sending SIGKILL to the command's process group", j.o.key, why)
	j.signal(syscall.SIGKILL)
}

// stopped handles the command stopping. On a job-control stop (Ctrl-Z, or a
// terminal read or write from the background) locker stops too, as a shell
// job would, after stopping the whole group, so that nothing of the job
// runs while locker cannot renew. Once continued, it continues the group
// (with the terminal, if locker has it), unless the lock was lost
// meanwhile. A stop by anyone else (SIGSTOP) is left alone.
func (j *job) stopped(sig syscall.Signal) {
	switch sig {
	case syscall.SIGTSTP, syscall.SIGTTIN, syscall.SIGTTOU:
	default:
		return
	}
	if sig != syscall.SIGTSTP && j.giveTerminal() {
		j.signal(syscall.SIGCONT)
		return
	}
	j.signal(syscall.SIGSTOP)
	j.o.logf("command stopped by %v: stopping too", sig)
	_ = unix.Kill(os.Getpid(), unix.SIGSTOP) // returns once continued
	j.o.logf("continued")
	j.check()
	if !j.killSent {
		j.giveTerminal()
		j.signal(syscall.SIGCONT)
	}
}

// signal sends s to the job's process group.
func (j *job) signal(s syscall.Signal) {
	if err := unix.Kill(-j.pid, s); err != nil && !errors.Is(err, unix.ESRCH) {
		j.o.logf("cannot send %v to process group %d: %v", s, j.pid, err)
	}
}

// groupAlive reports whether any process is left in the job's group.
func (j *job) groupAlive() bool { return !errors.Is(unix.Kill(-j.pid, 0), unix.ESRCH) }

// giveTerminal makes the job's group the foreground of the terminal on
// stdin, if locker's group has it, and reports whether it did.
func (j *job) giveTerminal() bool {
	return j.tty && inForegroundGroup() && unix.IoctlSetPointerInt(0, unix.TIOCSPGRP, j.pid) == nil
}

// restoreTerminal gives the terminal back to locker's group if the job's
// group still has it.
func (j *job) restoreTerminal() {
	if !j.tty {
		return
	}
	if pgrp, err := unix.IoctlGetInt(0, unix.TIOCGPGRP); err != nil || pgrp != j.pid {
		return
	}
	// From the background, taking the terminal raises SIGTTOU unless ignored.
	signal.Ignore(syscall.SIGTTOU)
	defer signal.Reset(syscall.SIGTTOU)
	_ = unix.IoctlSetPointerInt(0, unix.TIOCSPGRP, unix.Getpgrp())
}

// reaped is a state change of a child of locker: the command, or an orphan
// of the job it adopted. err (ECHILD) means no child is left.
type reaped struct {
	pid int
	ws  unix.WaitStatus
	err error
}

// reap reports every child's exit and stop on out until none is left.
func reap(out chan<- reaped) {
	for {
		var ws unix.WaitStatus
		pid, err := unix.Wait4(-1, &ws, unix.WUNTRACED, nil)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			out <- reaped{err: err}
			return
		}
		out <- reaped{pid: pid, ws: ws}
	}
}

// exitCode is the shell's code for a wait status: 128+N for signal N.
func exitCode(ws unix.WaitStatus) int {
	if ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	return ws.ExitStatus()
}

// isTerminal reports whether fd is a terminal.
func isTerminal(fd int) bool {
	_, err := unix.IoctlGetTermios(fd, unix.TCGETS)
	return err == nil
}

// inForegroundGroup reports whether locker's process group is the
// foreground group of the terminal on stdin.
func inForegroundGroup() bool {
	pgrp, err := unix.IoctlGetInt(0, unix.TIOCGPGRP)
	return err == nil && pgrp == unix.Getpgrp()
}
