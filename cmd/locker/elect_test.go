package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/internal/etcdtest"
	"github.com/go-locker/locker/internal/pgtest"
	"github.com/go-locker/locker/internal/redistest"
)

// Leader election across processes, on every backend with a server (mem
// is one process only: see the root package's tests). Five `locker run
// --elect` candidates, each running a job that writes its term to a shared
// fenced register (an append-only file: each line "TERM UNIXNANO"), and a
// `locker leader --watch -o json` observer in its own process:
//
//   - crash: the leader's locker and its job are killed with SIGKILL; a new
//     leader writes within TTL + 100ms (+ the job's start), with a higher
//     term;
//   - resign: the leader gets SIGTERM; its job stops, it resigns, and the
//     next leader writes within a handoff bound;
//   - the register never sees a lower term after a higher one;
//   - the observer reports every term, in order, with its value
//     (TestElectObserveProcess, on every backend).

func TestElectRedis(t *testing.T) {
	s := redistest.Start(t)
	checkElection(t, s.URL(), time.Second, 0)
	checkPause(t, s.URL(), time.Second, 0)
}

// etcd expires leases in a loop that runs every 500ms, so a crashed
// leader's lease ends up to 500ms after its TTL.
func TestElectEtcd(t *testing.T) {
	c := etcdtest.Start(t)
	checkElection(t, c.URL("/locker-elect-test"), 2*time.Second, 500*time.Millisecond)
	checkPause(t, c.URL("/locker-elect-test"), 2*time.Second, 500*time.Millisecond)
}

func TestElectPostgres(t *testing.T) {
	s := pgtest.Start(t)
	checkElection(t, s.URL(), time.Second, 0)
	checkPause(t, s.URL(), time.Second, 0)
}

func TestElectPostgresLease(t *testing.T) {
	s := pgtest.Start(t)
	checkElection(t, s.URL()+"&mode=lease", time.Second, 0)
	checkPause(t, s.URL()+"&mode=lease", time.Second, 0)
}

func TestElectFile(t *testing.T) {
	url := fileURL(t)
	checkElection(t, url, time.Second, 0)
	checkPause(t, url, time.Second, 0)
}

// candidate is one `locker run --elect` process.
type candidate struct {
	value string
	p     *proc
	job   string // the job's pid file
}

// writer is the job of a candidate: it writes its term to the register
// every 10ms until stopped.
func writer(register, pidfile string) []string {
	// LOCKER_TEST_CHILD marks it for killOrphans.
	return []string{"env", "LOCKER_TEST_CHILD=writer", "sh", "-c", `echo $$ > "$2"; while :; do echo "$LOCKER_TOKEN $(date +%s%N)" >> "$1"; sleep 0.01; done`, "sh", register, pidfile}
}

// checkElection runs the crash and resign rounds. expiryLag is how much
// later than the TTL the backend may end a lock whose holder died.
func checkElection(t *testing.T, url string, ttl, expiryLag time.Duration) {
	dir := t.TempDir()
	register := filepath.Join(dir, "register")
	env := []string{"LOCKER_URL=" + url}
	obs := start(t, env, "leader", "--watch", "-o", "json", "e")
	seen := observe(t, obs)
	if ld := seen.next(t); ld.Leader == nil || *ld.Leader {
		t.Fatalf("first report %+v, want no leader", ld)
	}
	cands := map[string]*candidate{}
	for i := range 5 {
		c := &candidate{value: "c" + strconv.Itoa(i), job: filepath.Join(dir, "pid"+strconv.Itoa(i))}
		c.p = start(t, env, append([]string{"run", "--ttl", ttl.String(), "--elect", c.value, "e", "--"}, writer(register, c.job)...)...)
		drain(c.p)
		cands[c.value] = c
	}
	var terms []uint64
	leader := func() *candidate {
		t.Helper()
		ld := seen.nextLeader(t)
		if n := len(terms); n > 0 && *ld.Term <= terms[n-1] {
			t.Fatalf("observer: term %d after %d", *ld.Term, terms[n-1])
		}
		terms = append(terms, *ld.Term)
		c := cands[*ld.Value]
		if c == nil {
			t.Fatalf("observer: leader value %q is no candidate's", *ld.Value)
		}
		return c
	}
	cur := leader()
	for round := range 3 {
		// The leader writes a few times before it goes.
		waitWrites(t, register, terms[len(terms)-1], 3, 10*time.Second)
		crash := round < 2
		at := time.Now()
		if crash {
			killCandidate(t, cur)
		} else {
			cur.p.signal(t, syscall.SIGTERM)
		}
		delete(cands, cur.value)
		next := leader()
		wrote := waitTerm(t, register, terms[len(terms)-1], at, 10*time.Second)
		elapsed := wrote.Sub(at)
		what := "resign"
		bound := 500 * time.Millisecond
		if crash {
			what, bound = "crash", ttl+expiryLag+100*time.Millisecond
		}
		t.Logf("%s: %s of %s (term %d) to the first write of %s (term %d): %v (observer saw it %v after the %s)",
			url, what, cur.value, terms[len(terms)-2], next.value, terms[len(terms)-1], elapsed.Round(time.Millisecond),
			seen.last.Sub(at).Round(time.Millisecond), what)
		// The job starts after the election: allow for a shell's start.
		if elapsed > bound+200*time.Millisecond {
			t.Errorf("%s: the next leader wrote %v after the %s, want within %v (+200ms for the job's start)", url, elapsed, what, bound)
		}
		if !crash {
			if code := cur.p.wait(t); code != 128+int(syscall.SIGTERM) {
				t.Errorf("the resigned leader exited with %d, want %d", code, 128+int(syscall.SIGTERM))
			}
		}
		cur = next
	}
	checkRegister(t, register)
}

// killCandidate kills a candidate's locker and its job with SIGKILL, as a
// crash of its host would.
func killCandidate(t *testing.T, c *candidate) {
	t.Helper()
	pid := pidOf(t, c.job)
	c.p.signal(t, syscall.SIGKILL)
	_ = syscall.Kill(-pid, syscall.SIGKILL) // the job's process group
	c.p.wait(t)
}

// waitTerm waits until the register holds a write of term made after
// after, and returns its time.
func waitTerm(t *testing.T, register string, term uint64, after time.Time, d time.Duration) time.Time {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		for _, w := range readRegister(t, register) {
			if w.term == term && w.at.After(after) {
				return w.at
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no write of term %d in the register within %v", term, d)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// waitWrites waits until the register holds n writes of term.
func waitWrites(t *testing.T, register string, term uint64, n int, d time.Duration) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		got := 0
		for _, w := range readRegister(t, register) {
			if w.term == term {
				got++
			}
		}
		if got >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d writes of term %d in the register within %v, want %d", got, term, d, n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

type write struct {
	term uint64
	at   time.Time
}

func readRegister(t *testing.T, register string) []write {
	t.Helper()
	b, err := os.ReadFile(register)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	var ws []write
	for _, l := range strings.Split(string(b), "\n") {
		f := strings.Fields(l)
		if len(f) != 2 {
			continue // a line being written
		}
		term, err1 := strconv.ParseUint(f[0], 10, 64)
		ns, err2 := strconv.ParseInt(f[1], 10, 64)
		if err1 != nil || err2 != nil {
			continue
		}
		ws = append(ws, write{term, time.Unix(0, ns)})
	}
	return ws
}

// checkRegister: the register, fenced, would never have had to refuse a
// write: no term is lower than one written before it.
func checkRegister(t *testing.T, register string) {
	t.Helper()
	var high uint64
	n := map[uint64]int{}
	for i, w := range readRegister(t, register) {
		if w.term < high {
			t.Fatalf("register: write %d has term %d after term %d", i, w.term, high)
		}
		high = w.term
		n[w.term]++
	}
	t.Logf("register: %d terms, writes per term %v", len(n), n)
}

// observation reads a `locker leader --watch -o json` process.
type observation struct {
	lines chan leaderJSON
	last  time.Time // when the last report arrived
}

func observe(t *testing.T, p *proc) *observation {
	o := &observation{lines: make(chan leaderJSON, 100)}
	go func() {
		for l := range p.lines {
			var ld leaderJSON
			if err := json.Unmarshal([]byte(l), &ld); err != nil {
				ld.Error = fmt.Sprintf("bad line %q: %v", l, err)
			}
			o.lines <- ld
		}
		close(o.lines)
	}()
	return o
}

func (o *observation) next(t *testing.T) leaderJSON {
	t.Helper()
	select {
	case ld, ok := <-o.lines:
		if !ok {
			t.Fatal("the observer exited")
		}
		o.last = time.Now()
		if ld.Error != "" {
			t.Fatalf("observer: %s", ld.Error)
		}
		return ld
	case <-time.After(30 * time.Second):
		t.Fatal("the observer reported nothing for 30s")
	}
	return leaderJSON{}
}

// nextLeader skips reports of no leader.
func (o *observation) nextLeader(t *testing.T) leaderJSON {
	t.Helper()
	for {
		if ld := o.next(t); ld.Leader != nil && *ld.Leader {
			return ld
		}
	}
}

// TestElectObserveProcess: on every backend, an observer in another
// process (locker leader --watch -o json) reports each term within the
// backend's bound (electBackend.observe): see checkObserve.
func TestElectObserveProcess(t *testing.T) {
	for _, be := range electBackends(t) {
		t.Run(be.name, func(t *testing.T) { checkObserve(t, be.url(), be.observe) })
	}
}

// checkObserve: an observer in another process reports each term, with its
// value, within bound of the grant (measured from the return of Campaign in
// this process), and the end of each term within bound of the resign. Each
// term is granted after a vacancy of observeVacancy, so an observer that
// learns of grants only by reading the holder is then at its slowest.
func checkObserve(t *testing.T, url string, bound time.Duration) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	l, err := locker.OpenURL(url)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	obs := start(t, []string{"LOCKER_URL=" + url}, "leader", "--watch", "-o", "json", "o")
	seen := observe(t, obs)
	if ld := seen.next(t); ld.Leader == nil || *ld.Leader {
		t.Fatalf("first report %+v, want no leader", ld)
	}
	e := l.Election("o")
	var grants, ends []time.Duration
	for i := range 5 {
		time.Sleep(observeVacancy) // nobody leads: the observer idles
		v := "v" + strconv.Itoa(i)
		lk, err := e.Campaign(ctx, v, locker.WithTTL(2*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		at := time.Now()
		ld := seen.next(t)
		if ld.Leader == nil || !*ld.Leader || *ld.Value != v || *ld.Term != lk.Token() {
			t.Fatalf("observer: %+v, want %q term %d", ld, v, lk.Token())
		}
		grants = append(grants, seen.last.Sub(at).Round(time.Millisecond))
		if err := lk.Release(ctx); err != nil {
			t.Fatal(err)
		}
		at = time.Now()
		if ld := seen.next(t); ld.Leader == nil || *ld.Leader {
			t.Fatalf("observer after the resign: %+v, want no leader", ld)
		}
		ends = append(ends, seen.last.Sub(at).Round(time.Millisecond))
	}
	t.Logf("%s: observer saw the grants after %v, the resigns after %v", url, grants, ends)
	for i := range grants {
		if grants[i] > bound || ends[i] > bound {
			t.Errorf("observer later than %v: grants %v, resigns %v", bound, grants, ends)
			break
		}
	}
}

// Observe bounds of checkObserve and TestElectObserveBound. Where the
// driver notifies changes (driver.ChangeWatcher: Redis, etcd, PostgreSQL
// lease mode, file), the 100ms; elsewhere Observe's 100ms reads plus a
// round trip, with slack for -race on a loaded machine.
const (
	observeNotified = 100 * time.Millisecond
	observePolled   = 250 * time.Millisecond
)

// observeVacancy is how long checkObserve leaves the election without a
// leader before each grant: past an observer's fast re-reads after a term
// ended (2ms, 4ms, … 64ms), so that one that reads instead of being
// notified reads every 100ms.
const observeVacancy = 300 * time.Millisecond

// checkPause: the leader's locker and its job are stopped (SIGSTOP) past
// the TTL, as a paused VM would be; another candidate is elected; on
// resume locker kills the old job before it can go on, and a fenced
// register would reject any write the old job still makes (reported).
func checkPause(t *testing.T, url string, ttl, expiryLag time.Duration) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	l, err := locker.OpenURL(url)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	dir := t.TempDir()
	register := filepath.Join(dir, "register")
	env := []string{"LOCKER_URL=" + url}
	cands := map[string]*candidate{}
	for i := range 3 {
		c := &candidate{value: "p" + strconv.Itoa(i), job: filepath.Join(dir, "pid"+strconv.Itoa(i))}
		c.p = start(t, env, append([]string{"run", "--ttl", ttl.String(), "--elect", c.value, "p", "--"}, writer(register, c.job)...)...)
		drain(c.p)
		cands[c.value] = c
	}
	e := l.Election("p")
	var ld locker.Leader
	waitFor(t, 30*time.Second, "a leader", func() bool {
		ld, err = e.Leader(ctx)
		return err == nil
	})
	old := cands[ld.Value]
	waitWrites(t, register, ld.Term, 3, 10*time.Second)
	waitFor(t, 10*time.Second, "the job's pid file", func() bool { _, err := os.Stat(old.job); return err == nil })
	jobPid := pidOf(t, old.job)
	_ = syscall.Kill(-jobPid, syscall.SIGSTOP)
	old.p.signal(t, syscall.SIGSTOP)
	at := time.Now()
	var next locker.Leader
	waitFor(t, ttl+expiryLag+10*time.Second, "a new leader", func() bool {
		next, err = e.Leader(ctx)
		return err == nil && next.Term > ld.Term
	})
	waitTerm(t, register, next.Term, at, 10*time.Second)
	t.Logf("%s: leader %s paused; %s elected (term %d) after %v", url, old.value, next.Value, next.Term, time.Since(at).Round(time.Millisecond))
	old.p.signal(t, syscall.SIGCONT)
	_ = syscall.Kill(-jobPid, syscall.SIGCONT)
	waitFor(t, 10*time.Second, "the old job's end", func() bool {
		return syscall.Kill(-jobPid, 0) == syscall.ESRCH
	})
	waitWrites(t, register, next.Term, 3, 10*time.Second)
	var high uint64
	rejected := 0
	for _, w := range readRegister(t, register) {
		switch {
		case w.term >= high:
			high = w.term
		case w.term == ld.Term && w.at.After(at):
			rejected++ // the old leader's write after its pause: fenced off
		default:
			t.Errorf("register: term %d after %d", w.term, high)
		}
	}
	t.Logf("%s: the register rejected %d writes of the paused leader after it resumed", url, rejected)
	select {
	case <-old.p.done:
		t.Errorf("the paused candidate exited (%d); it should campaign again", old.p.code)
	default:
	}
}

func pidOf(t testing.TB, file string) int {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	return pid
}

// waitFor polls cond every 5ms until it holds, failing the test after d.
func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s did not happen within %v", what, d)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
