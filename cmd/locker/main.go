package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"time"

	"github.com/go-locker/locker"
)

// Exit codes of the locker command. The command's own exit code is passed
// through unchanged (128+N if it was killed by signal N).
const (
	exitOK          = 0
	exitFree        = 1   // status: the key is free; bench: violations found
	exitUnavailable = 122 // the backend could not be reached (locker.ErrUnavailable)
	exitLost        = 123 // run: the lock was lost while the command ran
	exitNotAcquired = 124 // run: the lock was not acquired (held, or --wait ran out)
	exitUsage       = 125 // bad usage or configuration, or the backend failed otherwise
	exitCannotRun   = 126 // run: the command was found but could not be started
	exitNotFound    = 127 // run: the command was not found
)

// defaultURL is the backend used when neither --url nor $LOCKER_URL is set.
const defaultURL = "file://"

// pingTimeout bounds the check that the backend is reachable.
const pingTimeout = 10 * time.Second

func main() {
	os.Exit(Main(os.Args[1:], os.Stdout, os.Stderr))
}

const usageText = `usage:
  locker run    [--url URL] [--ttl D] [--wait D] [--on-lost term|kill|ignore] [--grace D]
                [--max-hold D] [--min-hold D] [--limit N] [-v] KEY -- COMMAND [ARGS...]
  locker run    --elect VALUE [--url URL] [--ttl D] [--on-lost …] [--grace D] [--max-hold D] [-v]
                KEY -- COMMAND [ARGS...]
  locker status [--url URL] [-o text|json] [--limit N] [-v] KEY
  locker leader [--url URL] [-o text|json] [--watch] [-v] KEY
  locker bench  [--url URL] [--workers N] [--duration D] [--hold H] [--ttl D] [--key KEY] [-v]
  locker drivers

URL defaults to $LOCKER_URL, else file:// (lock files in a local directory).
--limit N makes KEY a semaphore of N permits: at most N runs at once. N must be
1 to 1024, else exit 125; every driver has semaphores except Redis Redlock,
where --limit exits 125 saying so.
Run "locker COMMAND -h" for a command's flags. Exit codes: the command's own;
122 backend unavailable; 123 lock lost; 124 lock not acquired; 125 usage,
configuration or other backend error; 126 command not executable; 127
command not found. locker status: 0 held, 1 free. locker leader: 0 someone
leads, 1 nobody does; with --watch, 0 when interrupted. locker run --elect:
a lost lead is not an exit (the command is stopped and locker campaigns
again); 128+N on signal N while campaigning; after SIGTERM while leading,
the lead is resigned once the command has exited, and its code returned.
`

// Main runs the locker command with args (without the program name) and
// returns its exit code.
func Main(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usageText)
		return exitUsage
	}
	switch args[0] {
	case "run":
		return cmdRun(args[1:], stdout, stderr)
	case "status":
		return cmdStatus(args[1:], stdout, stderr)
	case "leader":
		return cmdLeader(args[1:], stdout, stderr)
	case "bench":
		return cmdBench(args[1:], stdout, stderr)
	case "drivers":
		fmt.Fprintln(stdout, strings.Join(locker.Drivers(), "\n"))
		return exitOK
	case "help", "-h", "-help", "--help":
		fmt.Fprint(stdout, usageText)
		return exitOK
	default:
		fmt.Fprintf(stderr, "locker: unknown command %q (want run, status, leader, bench or drivers; see locker help)\n", args[0])
		return exitUsage
	}
}

// common holds the flags every subcommand has.
type common struct {
	url     string
	verbose bool
	stderr  io.Writer
}

func newFlags(name string, stderr io.Writer, c *common) *flag.FlagSet {
	fs := flag.NewFlagSet("locker "+name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	c.stderr = stderr
	def := os.Getenv("LOCKER_URL")
	if def == "" {
		def = defaultURL
	}
	fs.StringVar(&c.url, "url", def, "backend `URL` (default $LOCKER_URL, else file://)")
	fs.BoolVar(&c.verbose, "v", false, "say what is being done, on stderr")
	return fs
}

// logf prints a progress line with -v.
func (c *common) logf(format string, args ...any) {
	if c.verbose {
		fmt.Fprintf(c.stderr, "locker: "+format+"\n", args...)
	}
}

// errorf prints one error line.
func (c *common) errorf(format string, args ...any) {
	fmt.Fprintln(c.stderr, "locker: "+oneLine(fmt.Sprintf(format, args...)))
}

// oneLine strips the root package's "locker: " prefixes (the command adds
// its own once) and folds the message onto one line.
func oneLine(s string) string {
	for strings.HasPrefix(s, "locker: ") {
		s = s[len("locker: "):]
	}
	return strings.Join(strings.Fields(strings.ReplaceAll(s, "locker: ", "")), " ")
}

// open opens the backend and checks that it is reachable.
func (c *common) open(ctx context.Context) (*locker.Locker, error) {
	if c.verbose {
		showLibraryLogs(c.stderr)
	}
	l, err := locker.OpenURL(c.url)
	if err != nil {
		return nil, err
	}
	c.logf("opened %s", redact(c.url))
	pctx, cancel := context.WithTimeout(ctx, pingTimeout)
	defer cancel()
	if err := l.Ping(pctx); err != nil {
		l.Close()
		if errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil {
			// No answer at all within pingTimeout: unreachable too.
			if !errors.Is(err, locker.ErrUnavailable) {
				err = fmt.Errorf("%w: %w", locker.ErrUnavailable, err)
			}
			return nil, fmt.Errorf("backend %s not reachable within %v: %w", redact(c.url), pingTimeout, err)
		}
		return nil, fmt.Errorf("backend %s not reachable: %w", redact(c.url), err)
	}
	return l, nil
}

// failCode is the exit code for a backend error: exitUnavailable if it
// could not be reached, else exitUsage. Unreachable is an error matching
// locker.ErrUnavailable, or, from a driver that does not wrap its own with
// it, a network error (*net.OpError: refused, reset, no route) or a
// connection the server closed (EOF).
func failCode(err error) int {
	var nerr *net.OpError
	if errors.Is(err, locker.ErrUnavailable) || errors.As(err, &nerr) ||
		errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return exitUnavailable
	}
	return exitUsage
}

// redact hides a password in a URL.
func redact(u string) string {
	scheme, rest, ok := strings.Cut(u, "://")
	if !ok {
		return u
	}
	host := rest
	if i := strings.IndexAny(rest, "/?#"); i >= 0 {
		host = rest[:i]
	}
	if at := strings.LastIndexByte(host, '@'); at >= 0 {
		if user, _, hasPw := strings.Cut(host[:at], ":"); hasPw {
			return scheme + "://" + user + ":xxxxx@" + rest[at+1:]
		}
	}
	return u
}

// checkKey rejects what the library would, before anything is opened.
func checkKey(key string) error {
	if key == "" {
		return errors.New("empty KEY")
	}
	return nil
}
