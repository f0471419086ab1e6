package conformance

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/driver"
)

// childEnv carries "key|ttl" to the child process of Faults/Pause; Run in
// a process that has it plays the paused holder instead of running the
// suite.
const childEnv = "LOCKER_CONFORMANCE_PAUSE_CHILD"

// childPrefix starts every line the child reports on; the rest of its
// output (the testing package's) is ignored.
const childPrefix = "conformance-child:"

// runChild is the child of Faults/Pause: it takes the write side of the
// shared track's read-write lock (where the driver offers shared holds),
// then the key, then reports on its standard output, one line each, the
// grants, a write every unit/20 with each lock's safe deadline while its
// Lost is open, and the moments the Losts closed. Times are Unix
// nanoseconds on the wall clock, which parent and child share.
func runChild(t *testing.T, h Harness, spec string) {
	key, ttlText, ok := strings.Cut(spec, "|")
	ttl, err := time.ParseDuration(ttlText)
	if !ok || err != nil {
		t.Fatalf("conformance: child: bad %s=%q", childEnv, spec)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	d, err := h.Open(ctx)
	if err != nil {
		t.Fatalf("conformance: child: Harness.Open: %v", err)
	}
	l := locker.New(d)
	defer func() { _ = l.Close() }()
	report := func(format string, args ...any) {
		fmt.Printf(childPrefix+" "+format+"\n", args...)
	}
	sw := childShared(ctx, t, l, key, ttl, report)
	start := time.Now()
	lk, err := l.Acquire(ctx, key, locker.WithTTL(ttl))
	if err != nil {
		report("error %q", err.Error())
		t.Fatalf("conformance: child: Acquire: %v", err)
	}
	report("granted %d %d %d %d", lk.Token(), start.UnixNano(), time.Now().UnixNano(), lk.Deadline().UnixNano())
	lostAt := make(chan time.Time, 1)
	go func() {
		<-lk.Lost()
		lostAt <- time.Now()
	}()
	tick := time.NewTicker(max(ttl/20, time.Millisecond))
	defer tick.Stop()
	for {
		at := time.Now()
		deadline := lk.Deadline()
		select {
		case when := <-lostAt:
			sw.end()
			report("lost %d %q", when.UnixNano(), fmt.Sprint(lk.Err()))
			rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			_ = lk.Release(rctx)
			cancel()
			return
		default:
		}
		report("write %d %d %d", lk.Token(), at.UnixNano(), deadline.UnixNano())
		sw.write()
		select {
		case <-tick.C:
		case <-ctx.Done():
			t.Fatal("conformance: child: Lost never closed")
		}
	}
}

// injectPause runs a holder in a child process, stops it with SIGSTOP for
// two TTLs while the contenders wait, resumes it, and records what it saw.
func (s *suite) injectPause(ctx context.Context, t *testing.T, h *history) error {
	if sigStop == nil {
		return fmt.Errorf("Harness.Pause needs SIGSTOP and SIGCONT, which %s does not have", runtime.GOOS)
	}
	for n := 0; ctx.Err() == nil; n++ {
		if err := s.pauseOnce(t, h, fmt.Sprintf("child%d", n)); err != nil {
			return err
		}
		pause(ctx, s.unit)
	}
	return nil
}

func (s *suite) pauseOnce(t *testing.T, h *history, who string) error {
	var run []string
	for _, part := range strings.Split(s.top, "/") {
		run = append(run, "^"+regexp.QuoteMeta(part)+"$")
	}
	cmd := exec.Command(os.Args[0], "-test.run="+strings.Join(run, "/"), "-test.count=1", "-test.timeout=3m")
	cmd.Env = append(append(os.Environ(), s.h.ChildEnv...), childEnv+"="+h.key+"|"+s.unit.String())
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("starting the child: %w", err)
	}
	lines := make(chan []string, 1024)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if rest, ok := strings.CutPrefix(sc.Text(), childPrefix+" "); ok {
				lines <- strings.SplitN(rest, " ", 5)
			}
		}
	}()
	defer func() {
		_ = cmd.Process.Signal(sigCont)
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
	}()
	ns := func(f string) time.Time {
		v, _ := strconv.ParseInt(f, 10, 64)
		return time.Unix(0, v)
	}
	next := func(limit time.Duration) ([]string, error) {
		select {
		case f, ok := <-lines:
			if !ok {
				return nil, fmt.Errorf("the child exited early (its output is above)")
			}
			return f, nil
		case <-time.After(limit):
			return nil, fmt.Errorf("no word from the child within %v", limit)
		}
	}
	var g *hgrant
	var sg *sgrant // the child's write hold of the shared track's lock
	for g == nil {
		f, err := next(30*time.Second + 5*s.unit)
		if err != nil {
			return err
		}
		switch f[0] {
		case "granted":
			tok, _ := strconv.ParseUint(f[1], 10, 64)
			g = &hgrant{who: who, token: tok, start: ns(f[2]), end: ns(f[3]), deadline: ns(f[4])}
		case "sgranted":
			tok, _ := strconv.ParseUint(f[1], 10, 64)
			sg = &sgrant{hgrant: hgrant{who: who + "/rw", token: tok, start: ns(f[2]), end: ns(f[3]), deadline: ns(f[4])}, mode: driver.SharedWrite}
			if tr := h.sh; tr != nil && tr.on {
				tr.mu.Lock()
				tr.grants = append(tr.grants, sg)
				tr.mu.Unlock()
			}
		case "error":
			return fmt.Errorf("the child could not take the key: %s", strings.Join(f[1:], " "))
		}
	}
	h.add(g)
	record := func(f []string) {
		if f[0] == "swrite" || f[0] == "slost" {
			h.sh.recordChild(sg, f, ns)
			return
		}
		h.mu.Lock()
		defer h.mu.Unlock()
		g.childLine(f, ns)
	}
	// Hold a moment, then stop the child for two TTLs.
	settle := time.After(s.unit / 4)
	for waiting := true; waiting; {
		select {
		case f, ok := <-lines:
			if !ok {
				return fmt.Errorf("the child exited while holding")
			}
			record(f)
		case <-settle:
			waiting = false
		}
	}
	if err := cmd.Process.Signal(sigStop); err != nil {
		return err
	}
	h.fault(g)
	time.Sleep(2 * s.unit) // the fault: the child stays stopped this long
	resumed := time.Now()
	if err := cmd.Process.Signal(sigCont); err != nil {
		return err
	}
	for {
		f, err := next(10*time.Second + 2*s.unit)
		if err != nil {
			return fmt.Errorf("after SIGCONT: %w", err)
		}
		record(f)
		if f[0] == "lost" {
			h.mu.Lock()
			h.resumeLs = append(h.resumeLs, g.lost.Sub(resumed))
			h.mu.Unlock()
			if late := g.lost.Sub(resumed); late > time.Second {
				t.Errorf("the child's Lost closed %v after it resumed past its deadline; want at once (≤ 1s)", late)
			}
			return nil
		}
	}
}

// childLine records in g a line of the child of Faults/Pause about it: a
// write ("write" or "swrite": token, time, safe deadline) or the moment its
// Lost closed ("lost" or "slost": time, cause).
func (g *hgrant) childLine(f []string, ns func(string) time.Time) {
	switch f[0] {
	case "write", "swrite":
		tok, _ := strconv.ParseUint(f[1], 10, 64)
		g.writes = append(g.writes, hwrite{token: tok, at: ns(f[2])})
		if dl := ns(f[3]); dl.After(g.deadline) {
			g.deadline = dl
		}
	case "lost", "slost":
		g.lost = ns(f[1])
		g.cause = strings.Join(f[2:], " ")
	}
}
