package main

import (
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/go-locker/locker/internal/pgtest"
	"github.com/go-locker/locker/internal/redistest"
)

// --max-hold and --min-hold, on the file driver and on a real Redis server
// started here.

// holdSlack bounds how late, on this loaded 2-core machine under -race, a
// signal, a death or a grant may come after the moment it is due.
const holdSlack = 500 * time.Millisecond

// quickExit keeps race-enabled programs (locker and the test's child) from
// sleeping a second at exit, so that a run that ends early is seen to.
var quickExit = []string{"GORACE=atexit_sleep_ms=0"}

func holdBackends(t *testing.T) map[string]func(t *testing.T) string {
	return map[string]func(t *testing.T) string{
		"file":  func(t *testing.T) string { return fileURL(t) },
		"redis": func(t *testing.T) string { return redistest.Start(t).URL() },
	}
}

// --max-hold: the job runs past the bound, with a grandchild (behind sh)
// that ignores SIGTERM. SIGTERM goes to the group --grace before the bound,
// the grandchild dies at the bound (SIGKILL), locker exits 123, and a second
// run waiting on the key is granted it only after the grandchild died,
// promptly after the bound, although the first run's renewals never failed
// (the TTL is shorter than the bound).
func TestRunMaxHold(t *testing.T) {
	for name, backend := range holdBackends(t) {
		t.Run(name, func(t *testing.T) {
			url := backend(t)
			pidfile := filepath.Join(t.TempDir(), "pid")
			const (
				ttl     = 900 * time.Millisecond
				maxHold = 2 * time.Second
			)
			grace := defaultGrace(ttl) // 225ms, under maxHold/2
			spawned := mono()
			a := start(t, nil, append([]string{"run", "--url", url, "--ttl", ttl.String(), "--max-hold", maxHold.String(), "job", "--"}, inSh(child("trap", pidfile)...)...)...)
			a.expect(t, "ready")
			ready := mono() // after the grant, so the bound is at most ready+maxHold
			pid, err := readPid(pidfile)
			if err != nil {
				t.Fatal(err)
			}
			death := watchDeath(t, pid)
			b := start(t, nil, append([]string{"run", "-v", "--url", url, "--wait", "1m", "job", "--"}, child("checkdead", pidfile)...)...)
			waitStderr(t, b, "waiting for")

			term := termAt(t, a.expect(t, "term "))
			died := awaitDeath(t, death, "the grandchild")
			// b's log of its grant, not its command's first output: a
			// race-enabled child can take most of a second to start on
			// this loaded machine.
			waitStderr(t, b, "acquired ")
			granted := mono() // after b's grant
			if got := b.expect(t, "alive", "dead"); got != "dead" {
				t.Fatalf("the second run started its command while the first run's grandchild was %s", got)
			}
			drain(a)
			if code := a.wait(t); code != exitLost {
				t.Fatalf("first run: code %d, want %d; stderr %s", code, exitLost, a.stderr.String())
			}
			if code := b.wait(t); code != 0 {
				t.Fatalf("second run: code %d; stderr %s", code, b.stderr.String())
			}
			if !strings.Contains(a.stderr.String(), "--max-hold 2s") {
				t.Errorf("first run's stderr does not name --max-hold: %s", a.stderr.String())
			}
			earliest, latest := spawned+maxHold, ready+maxHold // the bound is between
			t.Logf("bound in [%v, %v] after spawn; SIGTERM %v, death %v, second grant logged %v after spawn",
				earliest-spawned, latest-spawned, term-spawned, died-spawned, granted-spawned)
			if term < earliest-grace || term > latest-grace+holdSlack {
				t.Errorf("SIGTERM %v after spawn, want --grace %v before the bound, in [%v, %v]", term-spawned, grace, earliest-spawned, latest-spawned)
			}
			if died < term+grace/2 {
				t.Errorf("the grandchild died %v after SIGTERM: killed long before the bound", died-term)
			}
			if died > latest+holdSlack {
				t.Errorf("the grandchild died %v after the latest bound", died-latest)
			}
			if granted > latest+holdSlack {
				t.Errorf("second run granted %v after the latest bound: the lock was not released at --max-hold", granted-latest)
			}
		})
	}
}

// --min-hold: the first job exits at once, yet the key stays taken until
// the bound: a second run with --wait 0 is refused, and a third, waiting,
// is granted it only at the bound, promptly. On PostgreSQL, whose advisory
// locks end with the session, the first run keeps its session open, and so
// does not exit, until the bound.
func TestRunMinHold(t *testing.T) {
	backends := holdBackends(t)
	backends["postgres"] = func(t *testing.T) string { return pgtest.Start(t).URL() }
	for name, backend := range backends {
		t.Run(name, func(t *testing.T) {
			url := backend(t)
			sessionBound := name == "postgres"
			const minHold = 2 * time.Second
			spawned := mono()
			a := start(t, quickExit, append([]string{"run", "--url", url, "--min-hold", minHold.String(), "job", "--"}, child("exit", "0")...)...)
			a.expect(t, "ready")
			ready := mono() // after the grant
			drain(a)
			aDone := make(chan time.Duration, 1)
			go func() { <-a.done; aDone <- mono() }()
			earliest, latest := spawned+minHold, ready+minHold
			var exited time.Duration
			awaitA := func() {
				if code := a.wait(t); code != 0 {
					t.Fatalf("first run: code %d; stderr %s", code, a.stderr.String())
				}
				exited = <-aDone
			}
			if !sessionBound {
				awaitA()
				if exited > earliest-500*time.Millisecond {
					t.Fatalf("first run took %v: too slow to test an early exit", exited-spawned)
				}
			}
			code, _, stderr := run(t, quickExit, append([]string{"run", "--url", url, "--wait", "0", "job", "--"}, child("exit", "0")...)...)
			refused := mono()
			if code != exitNotAcquired {
				t.Fatalf("second run before the bound: code %d, want %d; stderr %s", code, exitNotAcquired, stderr)
			}
			if refused >= earliest {
				t.Fatalf("second run took until %v after spawn, past the bound: proves nothing", refused-spawned)
			}
			c := start(t, nil, append([]string{"run", "-v", "--url", url, "--wait", "1m", "job", "--"}, child("exit", "0")...)...)
			waitStderr(t, c, "acquired ")
			granted := mono() // c logged its grant (its command may start later)
			c.expect(t, "ready")
			drain(c)
			if code := c.wait(t); code != 0 {
				t.Fatalf("third run: code %d; stderr %s", code, c.stderr.String())
			}
			if sessionBound {
				awaitA()
				if exited < earliest {
					t.Errorf("first run exited %v before the earliest bound: its session, and the lock, ended early", earliest-exited)
				}
				if exited > latest+holdSlack {
					t.Errorf("first run exited %v after the latest bound", exited-latest)
				}
			}
			t.Logf("first run exited %v after spawn; bound in [%v, %v]; third run granted (logged) %v after spawn",
				exited-spawned, earliest-spawned, latest-spawned, granted-spawned)
			if granted < earliest {
				t.Errorf("third run granted %v before the earliest bound", earliest-granted)
			}
			if granted > latest+holdSlack {
				t.Errorf("third run granted %v after the latest bound", granted-latest)
			}
		})
	}
}

// --max-hold with --on-lost kill: no SIGTERM, SIGKILL at the bound; with
// ignore: nothing is sent, the lock is released at the bound while the
// command runs on, and locker exits 123 when it ends.
func TestRunMaxHoldOnLostModes(t *testing.T) {
	const maxHold = time.Second
	t.Run("kill", func(t *testing.T) {
		url := fileURL(t)
		pidfile := filepath.Join(t.TempDir(), "pid")
		spawned := mono()
		p := start(t, nil, append([]string{"run", "--url", url, "--max-hold", maxHold.String(), "--on-lost", "kill", "job", "--"}, inSh(child("trap", pidfile)...)...)...)
		p.expect(t, "ready")
		ready := mono()
		pid, err := readPid(pidfile)
		if err != nil {
			t.Fatal(err)
		}
		died := awaitDeath(t, watchDeath(t, pid), "the grandchild")
		if code := p.wait(t); code != exitLost {
			t.Fatalf("code %d, want %d; stderr %s", code, exitLost, p.stderr.String())
		}
		for l := range p.lines {
			if strings.HasPrefix(l, "term") {
				t.Errorf("the job got SIGTERM with --on-lost kill")
			}
		}
		if died < spawned+maxHold-killLead || died > ready+maxHold+holdSlack {
			t.Errorf("died %v after spawn, want at the bound, in [%v, %v]", died-spawned, maxHold, ready+maxHold-spawned)
		}
		if !strings.Contains(p.stderr.String(), "(--max-hold 1s reached; the lock is being released); sending SIGKILL") {
			t.Errorf("stderr: %s", p.stderr.String())
		}
	})
	t.Run("ignore", func(t *testing.T) {
		url := fileURL(t)
		p := start(t, nil, append([]string{"run", "--url", url, "--max-hold", maxHold.String(), "--on-lost", "ignore", "job", "--"}, child("signals")...)...)
		tok := tokenOf(t, p.expect(t, "ready"))
		waitStderr(t, p, `--max-hold 1s of lock "job" reached and the lock released; letting the command run (--on-lost=ignore)`)
		if !isFree(t, url, "job") {
			t.Fatalf("key still held (token %d) after --max-hold", tok)
		}
		p.signal(t, syscall.SIGUSR1) // still running: it answers
		if got := p.expect(t, "got"); got != "got user defined signal 1" {
			t.Fatalf("command said %q", got)
		}
		p.signal(t, syscall.SIGTERM)
		if got := p.expect(t, "got"); got != "got terminated" {
			t.Fatalf("command said %q", got)
		}
		if code := p.wait(t); code != exitLost {
			t.Fatalf("code %d, want %d", code, exitLost)
		}
		if strings.Contains(p.stderr.String(), "sending SIG") {
			t.Fatalf("a signal was sent with --on-lost ignore: %s", p.stderr.String())
		}
	})
}

// --max-hold counts from the grant, not from the start of the wait: a run
// that waited longer than its --max-hold still gets the whole bound, on
// the file driver and on Redis, whose fair queue waits in the server.
func TestRunMaxHoldCountsFromGrant(t *testing.T) {
	for name, open := range holdBackends(t) {
		t.Run(name, func(t *testing.T) { runMaxHoldCountsFromGrant(t, open(t)) })
	}
}

func runMaxHoldCountsFromGrant(t *testing.T, url string) {
	const maxHold = 3 * time.Second // long enough for a -race child to start and print "ready" on a loaded machine
	a := start(t, nil, append([]string{"run", "--url", url, "job", "--"}, child("signals")...)...)
	a.expect(t, "ready")
	b := start(t, nil, append([]string{"run", "-v", "--url", url, "--wait", "1m", "--max-hold", maxHold.String(), "--on-lost", "kill", "job", "--"}, child("signals")...)...)
	waitStderr(t, b, "waiting for")
	bDone := make(chan time.Duration, 1)
	go func() { <-b.done; bDone <- mono() }()
	// Wait past b's --max-hold before letting it have the key.
	for waited := mono(); mono()-waited < 3*maxHold/2; {
		time.Sleep(10 * time.Millisecond)
	}
	released := mono() // b's grant starts after this
	a.signal(t, syscall.SIGTERM)
	if code := a.wait(t); code != 7 {
		t.Fatalf("first run: code %d; stderr %s", code, a.stderr.String())
	}
	b.expect(t, "ready")
	ready := mono()
	drain(b)
	if code := b.wait(t); code != exitLost {
		t.Fatalf("second run: code %d, want %d; stderr %s", code, exitLost, b.stderr.String())
	}
	ended := <-bDone
	t.Logf("second run ended %v after the first released, %v after its command started", ended-released, ended-ready)
	if ended < released+maxHold-killLead {
		t.Errorf("second run ended %v after the first released: its --max-hold did not count from its grant", ended-released)
	}
	if ended > ready+maxHold+holdSlack+time.Second { // +1s: slack for a -race binary's exit
		t.Errorf("second run ended %v after its command started, want about %v", ended-ready, maxHold)
	}
}
