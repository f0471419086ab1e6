package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os/signal"
	"syscall"
	"time"

	"github.com/go-locker/locker"
)

// leaderJSON is one line of locker leader -o json: the leader of an
// election at one moment. The field names are stable.
type leaderJSON struct {
	// Election is the KEY argument: the election's name.
	Election string `json:"election"`
	// Leader is whether someone leads; absent when it could not be told
	// (Error says why).
	Leader *bool `json:"leader,omitempty"`
	// Value is the value the leader campaigned with, Term its term (its
	// fencing token) and RemainingMS the time its lock had left, in whole
	// milliseconds; all three only when Leader is true.
	Value       *string `json:"value,omitempty"`
	Term        *uint64 `json:"term,omitempty"`
	RemainingMS *int64  `json:"remaining_ms,omitempty"`
	// Error is the error, when there was one.
	Error string `json:"error,omitempty"`
}

type leaderOpts struct {
	common
	format string
	watch  bool
	name   string
	stdout io.Writer
}

func cmdLeader(args []string, stdout, stderr io.Writer) int {
	o := leaderOpts{stdout: stdout}
	fs := newFlags("leader", stderr, &o.common)
	fs.StringVar(&o.format, "o", "text", "output `format`: text, or json (one object per line: election, leader, value, term, remaining_ms, error)")
	fs.BoolVar(&o.watch, "watch", false, "print the leader, then every change, until interrupted")
	fs.Usage = func() {}
	fs.SetOutput(io.Discard)
	usage := "(usage: locker leader [--url URL] [-o text|json] [--watch] KEY; flags may follow KEY)"
	var rest []string
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				fs.SetOutput(stdout)
				fmt.Fprintln(stdout, "usage: locker leader [flags] KEY")
				fs.PrintDefaults()
				return exitOK
			}
			o.errorf("leader: %v %s", err, usage)
			return exitUsage
		}
		if fs.NArg() == 0 {
			break
		}
		rest = append(rest, fs.Arg(0))
		args = fs.Args()[1:]
	}
	switch {
	case len(rest) != 1:
		o.errorf("leader: want exactly one KEY, got %d arguments %s", len(rest), usage)
		return exitUsage
	case o.format != "text" && o.format != "json":
		o.errorf("leader: -o must be text or json, got %q", o.format)
		return exitUsage
	case rest[0] == "":
		o.errorf("leader: empty KEY")
		return exitUsage
	}
	o.name = rest[0]
	if o.watch {
		return o.watchLeader()
	}
	return o.once()
}

// once prints the current leader: exitOK if someone leads, exitFree if
// nobody does, else the error's exit code.
func (o *leaderOpts) once() int {
	ctx, cancel := context.WithTimeout(context.Background(), statusTimeout)
	defer cancel()
	l, err := o.open(ctx)
	if err != nil {
		return o.print(locker.Leader{}, err)
	}
	defer l.Close()
	ld, err := l.Election(o.name).Leader(ctx)
	return o.print(ld, err)
}

// watchLeader prints the leader and every change until SIGINT or SIGTERM
// (exitOK), or until an error that will not pass.
func (o *leaderOpts) watchLeader() int {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	defer stop()
	l, err := o.open(ctx)
	if err != nil {
		if ctx.Err() != nil {
			return exitOK
		}
		return o.print(locker.Leader{}, err)
	}
	defer l.Close()
	code := exitOK
	for ld, err := range l.Election(o.name).Observe(ctx) {
		code = o.print(ld, err)
		if code == exitFree {
			code = exitOK
		}
	}
	if ctx.Err() != nil {
		return exitOK
	}
	return code
}

// print writes one reading (or its error, also on stderr) and returns its
// exit code.
func (o *leaderOpts) print(ld locker.Leader, err error) int {
	res := leaderJSON{Election: o.name}
	code := exitOK
	switch {
	case err == nil && ld.Term != 0:
		res.Leader, res.Value, res.Term = new(true), new(ld.Value), new(ld.Term)
		res.RemainingMS = new(ld.Remaining.Milliseconds())
	case err == nil || errors.Is(err, locker.ErrNotHeld):
		res.Leader, code = new(false), exitFree
	case errors.Is(err, errors.ErrUnsupported):
		err = fmt.Errorf("the %s backend cannot report who holds a lock, which elections need", scheme(o.url))
		fallthrough
	default:
		res.Error = oneLine(err.Error())
		o.errorf("leader: %v", err)
		code = failCode(err)
	}
	if o.format == "json" {
		b, jerr := json.Marshal(res)
		if jerr != nil { // strings and numbers always marshal
			panic(jerr)
		}
		fmt.Fprintf(o.stdout, "%s\n", b)
	} else if res.Leader != nil {
		o.printText(ld, *res.Leader)
	}
	return code
}

func (o *leaderOpts) printText(ld locker.Leader, leads bool) {
	switch {
	case !leads:
		fmt.Fprintf(o.stdout, "%q has no leader\n", o.name)
	case o.watch:
		fmt.Fprintf(o.stdout, "term %d: %q leads (expires in %v)\n", ld.Term, ld.Value, ld.Remaining.Round(time.Millisecond))
	default:
		fmt.Fprintf(o.stdout, "election %s\nleader   %s\nterm     %d\nexpires  in %v\n",
			o.name, ld.Value, ld.Term, ld.Remaining.Round(time.Millisecond))
	}
}
