package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"time"

	"github.com/go-locker/locker"
)

// statusTimeout bounds locker status.
const statusTimeout = 30 * time.Second

// statusJSON is the output of locker status -o json: one object on one
// line. The field names are stable.
type statusJSON struct {
	// Key is the KEY argument.
	Key string `json:"key"`
	// Reachable is whether the backend answered.
	Reachable bool `json:"reachable"`
	// Held is whether someone holds the key; absent when it could not be
	// told (Error says why).
	Held *bool `json:"held,omitempty"`
	// Holder is the holder's owner string, Token its fencing token and
	// RemainingMS the TTL it has left in whole milliseconds, as the server
	// sees it; all three only when Held is true.
	Holder      string  `json:"holder,omitempty"`
	Token       *uint64 `json:"token,omitempty"`
	RemainingMS *int64  `json:"remaining_ms,omitempty"`
	// Limit is --limit, and Holders the holders of its permits, in token
	// order; both only with --limit (limit.go).
	Limit   *int         `json:"limit,omitempty"`
	Holders []holderJSON `json:"holders,omitempty"`
	// Error is the error, when there was one.
	Error string `json:"error,omitempty"`

	remaining time.Duration // for the text output
}

func cmdStatus(args []string, stdout, stderr io.Writer) int {
	var c common
	var format string
	var limit limitFlag
	fs := newFlags("status", stderr, &c)
	fs.Var(&limit, "limit", "list the holders of the semaphore KEY of `N` permits instead of the lock KEY")
	fs.StringVar(&format, "o", "text", "output `format`: text, or json (one object: key, reachable, held, holder, token, remaining_ms, error)")
	fs.Usage = func() {}
	fs.SetOutput(io.Discard)
	usage := "(usage: locker status [--url URL] [-o text|json] KEY; flags may follow KEY)"
	// Flags may come before and after KEY.
	var rest []string
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				fs.SetOutput(stdout)
				fmt.Fprintln(stdout, "usage: locker status [flags] KEY")
				fs.PrintDefaults()
				return exitOK
			}
			c.errorf("status: %v %s", err, usage)
			return exitUsage
		}
		if fs.NArg() == 0 {
			break
		}
		rest = append(rest, fs.Arg(0))
		args = fs.Args()[1:]
	}
	fs.SetOutput(stderr)
	if len(rest) != 1 {
		c.errorf("status: want exactly one KEY, got %d arguments %s", len(rest), usage)
		return exitUsage
	}
	if format != "text" && format != "json" {
		c.errorf("status: -o must be text or json, got %q", format)
		return exitUsage
	}
	key := rest[0]
	if err := checkKey(key); err != nil {
		c.errorf("status: %v", err)
		return exitUsage
	}
	res := statusJSON{Key: key}
	var code int
	if limit.set {
		code = c.statusLimit(key, limit.n, &res)
	} else {
		code = c.status(key, &res)
	}
	if format == "json" {
		b, err := json.Marshal(res)
		if err != nil { // a struct of strings and numbers always marshals
			panic(err)
		}
		fmt.Fprintf(stdout, "%s\n", b)
		return code
	}
	switch {
	case res.Held == nil:
	case limit.set:
		printHolders(stdout, &res)
	case *res.Held:
		fmt.Fprintf(stdout, "key      %s\nholder   %s\ntoken    %d\nexpires  in %v\n",
			key, res.Holder, *res.Token, res.remaining.Round(time.Millisecond))
	default:
		fmt.Fprintf(stdout, "%q is free\n", key)
	}
	return code
}

// status inspects key, fills res and returns the exit code: exitOK held,
// exitFree free, exitUnavailable if the backend could not be reached,
// exitUsage on other errors. Errors are also reported on stderr.
func (c *common) status(key string, res *statusJSON) int {
	fail := func(err error) int {
		res.Error = oneLine(err.Error())
		c.errorf("status: %v", err)
		return failCode(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), statusTimeout)
	defer cancel()
	l, err := c.open(ctx)
	if err != nil {
		return fail(err)
	}
	defer l.Close()
	res.Reachable = true
	in, err := l.Inspect(ctx, key)
	switch {
	case errors.Is(err, locker.ErrNotHeld):
		res.Held = new(false)
		return exitFree
	case errors.Is(err, errors.ErrUnsupported):
		return fail(fmt.Errorf("the %s backend cannot report who holds a lock", scheme(c.url)))
	case err != nil:
		code := fail(err)
		res.Reachable = code != exitUnavailable
		return code
	}
	res.Held = new(true)
	res.Holder, res.Token = in.Owner, new(in.Token)
	res.RemainingMS, res.remaining = new(in.Remaining.Milliseconds()), in.Remaining
	return exitOK
}

func scheme(u string) string {
	for i := 0; i < len(u); i++ {
		if u[i] == ':' {
			return u[:i]
		}
	}
	return u
}
