package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"time"

	"github.com/go-locker/locker"
)

// statusTimeout bounds locker status.
const statusTimeout = 30 * time.Second

func cmdStatus(args []string, stdout, stderr io.Writer) int {
	var c common
	fs := newFlags("status", stderr, &c)
	fs.Usage = func() {}
	fs.SetOutput(io.Discard)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fs.SetOutput(stdout)
			fmt.Fprintln(stdout, "usage: locker status [flags] KEY")
			fs.PrintDefaults()
			return exitOK
		}
		c.errorf("status: %v (usage: locker status [--url URL] KEY)", err)
		return exitUsage
	}
	fs.SetOutput(stderr)
	if fs.NArg() != 1 {
		c.errorf("status: want exactly one KEY, got %d arguments (usage: locker status [--url URL] KEY)", fs.NArg())
		return exitUsage
	}
	key := fs.Arg(0)
	if err := checkKey(key); err != nil {
		c.errorf("status: %v", err)
		return exitUsage
	}
	ctx, cancel := context.WithTimeout(context.Background(), statusTimeout)
	defer cancel()
	l, err := c.open(ctx)
	if err != nil {
		c.errorf("status: %v", err)
		return failCode(err)
	}
	defer l.Close()
	in, err := l.Inspect(ctx, key)
	switch {
	case errors.Is(err, locker.ErrNotHeld):
		fmt.Fprintf(stdout, "%q is free\n", key)
		return exitFree
	case errors.Is(err, errors.ErrUnsupported):
		c.errorf("status: the %s backend cannot report who holds a lock", scheme(c.url))
		return exitUsage
	case err != nil:
		c.errorf("status: %v", err)
		return failCode(err)
	}
	fmt.Fprintf(stdout, "key      %s\nholder   %s\ntoken    %d\nexpires  in %v\n",
		key, in.Owner, in.Token, in.Remaining.Round(time.Millisecond))
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
