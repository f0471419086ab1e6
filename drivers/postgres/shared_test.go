package postgres

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/go-locker/locker/driver"
	"github.com/go-locker/locker/internal/sharedtest"
	"github.com/jackc/pgx/v5"
)

// permitChild takes one permit of a semaphore of 2 through the raw driver,
// prints "ACQUIRED <token>" and then waits to be killed.
func permitChild() error {
	ttl, err := time.ParseDuration(os.Getenv(envTTL))
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	d, err := Open(ctx, os.Getenv(envURL))
	if err != nil {
		return err
	}
	tok, err := d.AcquireShared(ctx, os.Getenv(envKey), driver.SharedRequest{Mode: driver.SharedPermit,
		Owner: os.Getenv(envOwner), TTL: ttl, Limit: 2})
	if err != nil {
		return err
	}
	fmt.Printf("ACQUIRED %d\n", tok)
	<-ctx.Done()
	return nil
}

// modeURL is the test server's URL in mode (ModeAdvisory or ModeLease).
func modeURL(t testing.TB, mode string) string {
	if mode == ModeLease {
		return leaseURL(serverURL(t))
	}
	return serverURL(t)
}

func sreq(mode driver.SharedMode, owner string, ttl time.Duration, n int, wait bool) driver.SharedRequest {
	return driver.SharedRequest{Mode: mode, Owner: owner, TTL: ttl, Limit: n, Wait: wait}
}

// A permit holder in a child process is killed with SIGKILL: its permit
// comes back (advisory: when its session ends, at once; lease: just after
// its TTL), a waiter takes it, and the other holder keeps its own.
func TestSharedCrashedHolder(t *testing.T) {
	for _, mode := range []string{ModeAdvisory, ModeLease} {
		t.Run(mode, func(t *testing.T) {
			url := modeURL(t, mode)
			ttl := time.Second
			a, w := openT(t, url), openT(t, url)
			key := fmt.Sprintf("crash/%s/%d", mode, time.Now().UnixNano())
			ctx := ctxFor(t, 30*time.Second)
			if _, err := a.AcquireShared(ctx, key, sreq(driver.SharedPermit, "keeper", time.Minute, 2, false)); err != nil {
				t.Fatal(err)
			}
			cmd := exec.Command(os.Args[0], "-test.run=^$")
			cmd.Env = append(os.Environ(), envChild+"=permit", envURL+"="+url, envKey+"="+key, envOwner+"=child", envTTL+"="+ttl.String())
			out, err := cmd.StdoutPipe()
			if err != nil {
				t.Fatal(err)
			}
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
			line, err := bufio.NewReader(out).ReadString('\n')
			if !strings.HasPrefix(line, "ACQUIRED ") {
				t.Fatalf("child: %q, %v", line, err)
			}
			acquired := time.Now()
			got := make(chan error, 1)
			go func() {
				_, err := w.AcquireShared(ctx, key, sreq(driver.SharedPermit, "waiter", time.Minute, 2, true))
				got <- err
			}()
			time.Sleep(100 * time.Millisecond)
			select {
			case err := <-got:
				t.Fatalf("the waiter returned (%v) while two permits of 2 are held", err)
			default:
			}
			if err := cmd.Process.Kill(); err != nil {
				t.Fatal(err)
			}
			killed := time.Now()
			if err := <-got; err != nil {
				t.Fatalf("waiter: %v", err)
			}
			after := time.Since(killed)
			t.Logf("permit taken over %v after the kill (child's TTL %v, granted %v before the kill)", after, ttl, killed.Sub(acquired))
			// Advisory: the session ends with the process. Lease: the
			// permit comes back at the child's TTL.
			if mode == ModeAdvisory && after > 500*time.Millisecond || mode == ModeLease && time.Since(acquired) > ttl+500*time.Millisecond {
				t.Fatalf("permit taken over %v after the kill", after)
			}
			if err := a.RefreshShared(ctx, key, driver.SharedPermit, "keeper", time.Minute); err != nil {
				t.Fatalf("the other holder lost its permit: %v", err)
			}
		})
	}
}

// Eight Lockers loop taking read holds while a writer waits: the writer is
// granted once the reads held at its arrival end (each is held 2ms), with
// no reader beside it (sharedtest.WriterStarvation).
func TestSharedWriterStarvation(t *testing.T) {
	for _, mode := range []string{ModeAdvisory, ModeLease} {
		t.Run(mode, func(t *testing.T) {
			url := modeURL(t, mode)
			sharedtest.WriterStarvation(t, func() driver.SharedLocker { return openT(t, url) }, 2*time.Second)
		})
	}
}

// Keys are opaque bytes: keys that differ only after a NUL, or by a
// prefix, are different locks, in both kinds and both modes.
func TestSharedOpaqueKeys(t *testing.T) {
	for _, mode := range []string{ModeAdvisory, ModeLease} {
		t.Run(mode, func(t *testing.T) {
			url := modeURL(t, mode)
			l := openT(t, url)
			ctx := ctxFor(t, 30*time.Second)
			for _, k := range []string{"op\x00a", "op\x00b", "op", "op\x00", "\x00op", "op/\xff\xfe"} {
				key := fmt.Sprint(mode, time.Now().UnixNano()) + k
				if _, err := l.AcquireShared(ctx, key, sreq(driver.SharedPermit, "p", time.Minute, 1, false)); err != nil {
					t.Fatalf("permit of %q: %v", key, err)
				}
				if _, err := l.AcquireShared(ctx, key, sreq(driver.SharedWrite, "w", time.Minute, 0, false)); err != nil {
					t.Fatalf("write of %q: %v", key, err)
				}
				hs, err := l.InspectShared(ctx, key, driver.SharedPermit)
				if err != nil || len(hs) != 1 {
					t.Fatalf("holders of %q: %v, %v", key, hs, err)
				}
			}
		})
	}
}

// Open in lease mode creates the shared table and its functions in a
// schema an earlier version made without them; the sweep deletes a
// released lock's row, and the next grant's token is still higher.
func TestSharedSetupAndSweep(t *testing.T) {
	schema := fmt.Sprintf("shared_setup_%d", time.Now().UnixNano())
	url := leaseURL(serverURL(t)) + "&schema=" + schema
	ctx := ctxFor(t, 60*time.Second)
	l := openT(t, url)
	if _, err := l.lease.pool.Exec(ctx, `DROP TABLE `+pgx.Identifier{schema, SharedTableName}.Sanitize()+` CASCADE`); err != nil {
		t.Fatal(err)
	}
	for _, f := range sharedFuncNames(schema) {
		if _, err := l.lease.pool.Exec(ctx, `DROP FUNCTION `+f); err != nil {
			t.Fatal(err)
		}
	}
	l2 := openT(t, url) // an existing schema without the shared table
	tok, err := l2.AcquireShared(ctx, "k", sreq(driver.SharedPermit, "o", time.Minute, 1, false))
	if err != nil {
		t.Fatal(err)
	}
	if err := l2.ReleaseShared(ctx, "k", driver.SharedPermit, "o"); err != nil {
		t.Fatal(err)
	}
	if n, err := l2.lease.sweepShared(ctx, 0); err != nil || n != 1 {
		t.Fatalf("sweep: %d rows, %v; want the released lock's 1", n, err)
	}
	again, err := l2.AcquireShared(ctx, "k", sreq(driver.SharedPermit, "o", time.Minute, 1, false))
	if err != nil || again <= tok {
		t.Fatalf("after the sweep: token %d, %v; want above %d", again, err, tok)
	}
	if n, err := l2.lease.sweepShared(ctx, 0); err != nil || n != 0 {
		t.Fatalf("sweep with a live holder: %d rows, %v; want 0", n, err)
	}
}
