package postgres

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/driver"
)

// The paused-holder test runs its holder in a child process (this test
// binary re-executed with LOCKER_PG_CHILD=holder), so that it can be frozen
// with SIGSTOP while its TCP connection stays up.
const (
	envChild = "LOCKER_PG_CHILD"
	envURL   = "LOCKER_PG_CHILD_URL"
	envKey   = "LOCKER_PG_CHILD_KEY"
	envOwner = "LOCKER_PG_CHILD_OWNER"
	envTTL   = "LOCKER_PG_CHILD_TTL"
)

// runChild runs the helper process when the binary is re-executed as one,
// and reports whether it did (it then exits without running tests).
func runChild() bool {
	run := holderChild
	switch os.Getenv(envChild) {
	case "holder":
	case "permit":
		run = permitChild
	default:
		return false
	}
	if err := run(); err != nil {
		fmt.Println("ERROR", err)
		os.Exit(1)
	}
	os.Exit(0)
	return true
}

// holderChild takes the lock through package locker with auto-renewal,
// prints "ACQUIRED <token>", and waits for the lock to be lost (it is
// expected to be frozen meanwhile). Then it asks the raw driver to refresh
// and prints "LOST <token> notheld=<bool>".
func holderChild() error {
	ttl, err := time.ParseDuration(os.Getenv(envTTL))
	if err != nil {
		return err
	}
	key, owner := os.Getenv(envKey), os.Getenv(envOwner)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	d, err := Open(ctx, os.Getenv(envURL))
	if err != nil {
		return err
	}
	l := locker.New(d)
	defer l.Close()
	lk, err := l.TryAcquire(ctx, key, locker.WithTTL(ttl), locker.WithOwner(owner))
	if err != nil {
		return err
	}
	fmt.Printf("ACQUIRED %d\n", lk.Token())
	select {
	case <-lk.Lost():
	case <-ctx.Done():
		return errors.New("lock never lost")
	}
	err = d.Refresh(ctx, key, owner, ttl)
	fmt.Printf("LOST %d notheld=%v err=%v\n", lk.Token(), errors.Is(err, driver.ErrNotHeld), err)
	return nil
}

// child is a running helper process.
type child struct {
	cmd   *exec.Cmd
	lines chan string
}

func startHolderChild(t *testing.T, url, key, owner string, ttl time.Duration) *child {
	t.Helper()
	return startHolderChildIn(t, nil, url, key, owner, ttl)
}

// startHolderChildIn runs the helper process under a command prefix, such
// as "ip netns exec NAME".
func startHolderChildIn(t *testing.T, prefix []string, url, key, owner string, ttl time.Duration) *child {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	argv := append(append([]string{}, prefix...), self, "-test.run=^$")
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = append(os.Environ(), envChild+"=holder", envURL+"="+url, envKey+"="+key,
		envOwner+"="+owner, envTTL+"="+ttl.String())
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	c := &child{cmd: cmd, lines: make(chan string, 16)}
	go func() {
		defer close(c.lines)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			c.lines <- sc.Text()
		}
		_, _ = io.Copy(io.Discard, out)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(os.Kill)
		_ = cmd.Process.Signal(contSignal)
		_ = cmd.Wait()
	})
	return c
}

// expect waits for the child's next line, which must start with prefix.
func (c *child) expect(t *testing.T, prefix string, limit time.Duration) string {
	t.Helper()
	line := c.next(t, limit)
	if !strings.HasPrefix(line, prefix) {
		t.Fatalf("child printed %q, want %s…", line, prefix)
	}
	return line
}

// next waits for the child's next line; "EXITED" if it exited first.
func (c *child) next(t *testing.T, limit time.Duration) string {
	t.Helper()
	select {
	case line, ok := <-c.lines:
		if !ok {
			return "EXITED"
		}
		return line
	case <-time.After(limit):
		t.Fatalf("child printed nothing within %v", limit)
	}
	return ""
}
