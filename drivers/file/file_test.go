package file

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/driver"
)

// TestMain lets the test binary serve as a separate process holding locks:
// see helperMain.
func TestMain(m *testing.M) {
	if os.Getenv("LOCKER_FILE_HELPER") != "" {
		os.Exit(helperMain())
	}
	os.Exit(m.Run())
}

func open(t testing.TB, dir string) *Locker {
	t.Helper()
	l, err := Open(context.Background(), "file://"+dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// entries lists dir, less the token counter.
func entries(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		if e.Name() != tokenFile {
			names = append(names, e.Name())
		}
	}
	return names
}

func TestAcquireRefreshRelease(t *testing.T) {
	dir := t.TempDir()
	a, b := open(t, dir), open(t, dir)
	ctx := ctxT(t)
	tok, err := a.Acquire(ctx, "k", "A", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	_, err = b.Acquire(ctx, "k", "B", time.Minute)
	var held *driver.HeldError
	if !errors.As(err, &held) || !errors.Is(err, driver.ErrNotAcquired) || held.Remaining <= 0 || held.Remaining > time.Minute {
		t.Fatalf("contended Acquire = %v, want HeldError with 0 < remaining <= 1m", err)
	}
	// Idempotent for the holder, from another Locker too.
	if tok2, err := b.Acquire(ctx, "k", "A", time.Minute); err != nil || tok2 != tok {
		t.Fatalf("re-Acquire by holder = %d, %v; want %d", tok2, err, tok)
	}
	info, err := b.Inspect(ctx, "k")
	if err != nil || info.Owner != "A" || info.Token != tok || info.Remaining <= 0 || info.Remaining > time.Minute {
		t.Fatalf("Inspect = %+v, %v", info, err)
	}
	if err := b.Refresh(ctx, "k", "B", time.Minute); !errors.Is(err, driver.ErrNotHeld) {
		t.Fatalf("Refresh by non-holder = %v", err)
	}
	if err := b.Release(ctx, "k", "B"); !errors.Is(err, driver.ErrNotHeld) {
		t.Fatalf("Release by non-holder = %v", err)
	}
	if err := a.Refresh(ctx, "k", "A", time.Hour); err != nil {
		t.Fatal(err)
	}
	if info, _ := a.Inspect(ctx, "k"); info.Remaining <= time.Minute {
		t.Fatalf("Refresh did not extend: %v", info.Remaining)
	}
	if err := a.Release(ctx, "k", "A"); err != nil {
		t.Fatal(err)
	}
	// The record stays, with no owner, keeping the token.
	if r := readRecord(t, a.Path("k")); r.owner != "" || r.token != tok || r.key != "k" {
		t.Fatalf("record after release: %+v", r)
	}
	if err := a.Release(ctx, "k", "A"); !errors.Is(err, driver.ErrNotHeld) {
		t.Fatalf("second Release = %v", err)
	}
	if err := a.Refresh(ctx, "k", "A", time.Minute); !errors.Is(err, driver.ErrNotHeld) {
		t.Fatalf("Refresh after release = %v", err)
	}
	if _, err := a.Inspect(ctx, "k"); !errors.Is(err, driver.ErrNotHeld) {
		t.Fatalf("Inspect of a free key = %v", err)
	}
	tok3, err := b.Acquire(ctx, "k", "B", time.Minute)
	if err != nil || tok3 <= tok {
		t.Fatalf("Acquire after release = %d, %v; want > %d", tok3, err, tok)
	}
}

func TestExpiry(t *testing.T) {
	dir := t.TempDir()
	a, b := open(t, dir), open(t, dir)
	ctx := ctxT(t)
	const ttl = 50 * time.Millisecond
	start := time.Now()
	tok, err := a.Acquire(ctx, "k", "A", ttl)
	if err != nil {
		t.Fatal(err)
	}
	var tok2 uint64
	for {
		tok2, err = b.Acquire(ctx, "k", "B", time.Minute)
		if err == nil {
			break
		}
		var held *driver.HeldError
		if !errors.As(err, &held) {
			t.Fatal(err)
		}
		time.Sleep(held.Remaining) // the holder's remaining TTL, as the root does
	}
	if el := time.Since(start); el < ttl {
		t.Fatalf("taken over after %v, before the ttl %v", el, ttl)
	}
	if tok2 <= tok {
		t.Fatalf("token after expiry %d <= %d", tok2, tok)
	}
	// The expired holder cannot refresh or release.
	if err := a.Refresh(ctx, "k", "A", time.Minute); !errors.Is(err, driver.ErrNotHeld) {
		t.Fatalf("Refresh by expired holder = %v", err)
	}
	if err := a.Release(ctx, "k", "A"); !errors.Is(err, driver.ErrNotHeld) {
		t.Fatalf("Release by expired holder = %v", err)
	}
	if info, err := a.Inspect(ctx, "k"); err != nil || info.Owner != "B" {
		t.Fatalf("Inspect = %+v, %v", info, err)
	}
}

// An expired lease is not revived by its former owner's Refresh, even with
// nobody else taking the key.
func TestRefreshDoesNotRevive(t *testing.T) {
	a := open(t, t.TempDir())
	ctx := ctxT(t)
	if _, err := a.Acquire(ctx, "k", "A", time.Millisecond); err != nil {
		t.Fatal(err)
	}
	waitExpired(t, a, "k")
	if err := a.Refresh(ctx, "k", "A", time.Minute); !errors.Is(err, driver.ErrNotHeld) {
		t.Fatalf("Refresh of an expired lease = %v", err)
	}
	if err := a.Release(ctx, "k", "A"); !errors.Is(err, driver.ErrNotHeld) {
		t.Fatalf("Release of an expired lease = %v", err)
	}
}

// waitExpired waits until key's lease has expired.
func waitExpired(t *testing.T, l *Locker, key string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err := l.Inspect(ctxT(t), key); errors.Is(err, driver.ErrNotHeld) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("lease never expired")
		}
		time.Sleep(time.Millisecond)
	}
}

// readRecord reads the record in the lock file at path.
func readRecord(t *testing.T, path string) lease {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	r, ok := decode(b)
	if !ok {
		t.Fatalf("unreadable record %q", b)
	}
	return r
}

func TestBadInput(t *testing.T) {
	dir := t.TempDir()
	l := open(t, dir)
	ctx := ctxT(t)
	long := strings.Repeat("x", MaxKeyLen+1)
	for name, err := range map[string]error{
		"empty key":     first(l.Acquire(ctx, "", "o", time.Second)),
		"long key":      first(l.Acquire(ctx, long, "o", time.Second)),
		"empty owner":   first(l.Acquire(ctx, "k", "", time.Second)),
		"long owner":    first(l.Acquire(ctx, "k", strings.Repeat("o", MaxOwnerLen+1), time.Second)),
		"zero ttl":      first(l.Acquire(ctx, "k", "o", 0)),
		"negative ttl":  first(l.Acquire(ctx, "k", "o", -time.Second)),
		"refresh ttl":   l.Refresh(ctx, "k", "o", -1),
		"refresh key":   l.Refresh(ctx, "", "o", time.Second),
		"release key":   l.Release(ctx, "", "o"),
		"release owner": l.Release(ctx, "k", ""),
		"inspect key":   second(l.Inspect(ctx, "")),
		"subscribe key": subErr(l.Subscribe(ctx, "")),
	} {
		if !errors.Is(err, driver.ErrInvalid) || !strings.HasPrefix(err.Error(), "file: ") {
			t.Errorf("%s: %v, want a file: error wrapping ErrInvalid", name, err)
		}
	}
	if got := entries(t, dir); len(got) != 0 {
		t.Fatalf("bad input left files: %v", got)
	}
}

func first[T any](_ T, err error) error  { return err }
func second[T any](_ T, err error) error { return err }
func subErr(_ <-chan struct{}, cancel func(), err error) error {
	if cancel != nil {
		cancel()
	}
	return err
}

func TestContext(t *testing.T) {
	dir := t.TempDir()
	l := open(t, dir)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := l.Acquire(ctx, "k", "o", time.Minute); !errors.Is(err, context.Canceled) {
		t.Fatalf("Acquire with a cancelled ctx = %v", err)
	}
	if got := entries(t, dir); len(got) != 0 {
		t.Fatalf("cancelled Acquire left files: %v", got)
	}
	if err := l.Refresh(ctx, "k", "o", time.Minute); !errors.Is(err, context.Canceled) {
		t.Fatalf("Refresh = %v", err)
	}
	if err := l.Release(ctx, "k", "o"); !errors.Is(err, context.Canceled) {
		t.Fatalf("Release = %v", err)
	}
	if _, err := l.Inspect(ctx, "k"); !errors.Is(err, context.Canceled) {
		t.Fatalf("Inspect = %v", err)
	}
	if err := l.Ping(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("Ping = %v", err)
	}
	if err := subErr(l.Subscribe(ctx, "k")); !errors.Is(err, context.Canceled) {
		t.Fatalf("Subscribe = %v", err)
	}
}

// A process stopped while it holds a lock file's flock cannot make others
// hang: their calls end with their ctx.
func TestHeldFlockDoesNotBlockPastContext(t *testing.T) {
	dir := t.TempDir()
	l := open(t, dir)
	p := startHelper(t, dir, "flock", "k")
	p.expect(t, "locked")
	for name, call := range map[string]func(context.Context) error{
		"acquire": func(ctx context.Context) error { return first(l.Acquire(ctx, "k", "o", time.Minute)) },
		"refresh": func(ctx context.Context) error { return l.Refresh(ctx, "k", "o", time.Minute) },
		"release": func(ctx context.Context) error { return l.Release(ctx, "k", "o") },
		"inspect": func(ctx context.Context) error { return second(l.Inspect(ctx, "k")) },
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
		start := time.Now()
		err := call(ctx)
		cancel()
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("%s under a held flock = %v, want DeadlineExceeded", name, err)
		}
		if d := time.Since(start); d > 10*time.Second {
			t.Errorf("%s returned after %v", name, d)
		}
	}
}

func TestHashCollisionDetected(t *testing.T) {
	dir := t.TempDir()
	l := open(t, dir)
	ctx := ctxT(t)
	// Plant a lease for another key under k's file name.
	r := lease{token: 1, boot: l.boot, expires: monoNow() + int64(time.Hour), owner: "X", key: "other"}
	if err := os.WriteFile(l.Path("k"), r.encode(nil), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Acquire(ctx, "k", "o", time.Minute); err == nil || !strings.Contains(err.Error(), "collides") {
		t.Fatalf("Acquire over a colliding lease = %v", err)
	}
	if _, err := l.Inspect(ctx, "k"); !errors.Is(err, driver.ErrNotHeld) {
		t.Fatalf("Inspect over a colliding lease = %v", err)
	}
	if err := l.Release(ctx, "k", "X"); !errors.Is(err, driver.ErrNotHeld) {
		t.Fatalf("Release over a colliding lease = %v", err)
	}
}

func TestCorruptLeaseIsFree(t *testing.T) {
	dir := t.TempDir()
	l := open(t, dir)
	ctx := ctxT(t)
	if err := os.WriteFile(l.Path("k"), []byte("garbage"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Acquire(ctx, "k", "o", time.Minute); err != nil {
		t.Fatalf("Acquire over garbage = %v", err)
	}
}

func TestClose(t *testing.T) {
	l := open(t, t.TempDir())
	ctx := ctxT(t)
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if err := l.Close(); err != nil {
		t.Fatalf("second Close = %v", err)
	}
	for name, err := range map[string]error{
		"acquire":   first(l.Acquire(ctx, "k", "o", time.Second)),
		"refresh":   l.Refresh(ctx, "k", "o", time.Second),
		"release":   l.Release(ctx, "k", "o"),
		"inspect":   second(l.Inspect(ctx, "k")),
		"ping":      l.Ping(ctx),
		"subscribe": subErr(l.Subscribe(ctx, "k")),
	} {
		if !errors.Is(err, driver.ErrClosed) {
			t.Errorf("%s after Close = %v", name, err)
		}
	}
}

func TestPing(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "d")
	l := open(t, dir)
	if err := l.Ping(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	if err := l.Ping(ctxT(t)); err == nil {
		t.Fatal("Ping of a removed directory succeeded")
	}
}

func TestRegistered(t *testing.T) {
	l, err := locker.OpenURL("file://" + t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	lk, err := l.TryAcquire(ctxT(t), "k")
	if err != nil {
		t.Fatal(err)
	}
	if err := lk.Release(ctxT(t)); err != nil {
		t.Fatal(err)
	}
}

// TestCrossProcess runs workers in separate processes that increment a
// counter in a shared file under the lock, with a read, a pause and a write:
// any overlap loses an increment. Each also checks that the tokens it gets
// increase against a fence file, as a fenced resource would.
func TestCrossProcess(t *testing.T) {
	dir := t.TempDir()
	const procs, rounds = 4, 40
	var ps []*helper
	for range procs {
		ps = append(ps, startHelper(t, dir, "count", strconv.Itoa(rounds)))
	}
	for _, p := range ps {
		p.expect(t, "done")
		if err := p.cmd.Wait(); err != nil {
			t.Fatalf("worker: %v", err)
		}
	}
	b, err := os.ReadFile(filepath.Join(dir, "counter"))
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.TrimSpace(string(b)); got != strconv.Itoa(procs*rounds) {
		t.Fatalf("counter = %s, want %d: increments were lost to overlapping holders", got, procs*rounds)
	}
}

// helper is a separate process running helperMain.
type helper struct {
	cmd   *exec.Cmd
	lines chan string
}

func startHelper(t *testing.T, dir string, args ...string) *helper {
	t.Helper()
	cmd := exec.Command(os.Args[0], append([]string{"-test.run=^$", dir}, args...)...)
	cmd.Env = append(os.Environ(), "LOCKER_FILE_HELPER=1")
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	h := &helper{cmd: cmd, lines: make(chan string, 100)}
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			h.lines <- sc.Text()
		}
		close(h.lines)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	return h
}

func (h *helper) expect(t *testing.T, want string) {
	t.Helper()
	select {
	case got, ok := <-h.lines:
		if !ok || got != want {
			t.Fatalf("helper said %q (open %v), want %q", got, ok, want)
		}
	case <-time.After(60 * time.Second):
		t.Fatalf("helper did not say %q in time", want)
	}
}

// helperMain runs in a helper process: args are -test.run, dir, mode, arg.
func helperMain() int {
	args := os.Args[2:]
	dir, mode, arg := args[0], args[1], args[2]
	l, err := Open(context.Background(), "file://"+dir)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	ctx := context.Background()
	switch mode {
	case "flock": // hold the flock of key arg's file until killed
		if _, err := l.Acquire(ctx, arg, "helper", time.Hour); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		f, err := os.OpenFile(l.Path(arg), os.O_RDWR, 0)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		if err := flockBlocking(f); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		fmt.Println("locked")
		for {
			time.Sleep(time.Hour) // until the test kills us
		}
	case "acquire": // take key arg for an hour and exit without releasing
		if _, err := l.Acquire(ctx, arg, "helper", time.Hour); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		fmt.Println("acquired")
		return 0
	case "release": // release key arg, taken by "acquire"
		if err := l.Release(ctx, arg, "helper"); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		fmt.Println("released")
		return 0
	case "count":
		rounds, _ := strconv.Atoi(arg)
		lk := locker.New(l)
		owner := strconv.Itoa(os.Getpid())
		var mu sync.Mutex // only one goroutine; documents the critical section
		for range rounds {
			h, err := lk.Acquire(ctx, "counter", locker.WithTTL(time.Minute), locker.WithOwner(owner))
			if err != nil {
				fmt.Fprintln(os.Stderr, err)
				return 1
			}
			mu.Lock()
			err = incrementFenced(dir, h.Token())
			mu.Unlock()
			if err != nil {
				fmt.Fprintln(os.Stderr, err)
				return 1
			}
			if err := h.Release(ctx); err != nil {
				fmt.Fprintln(os.Stderr, err)
				return 1
			}
		}
		fmt.Println("done")
		return 0
	}
	return sharedHelper(l, mode, arg)
}

func incrementFenced(dir string, token uint64) error {
	fence := filepath.Join(dir, "fence")
	if b, err := os.ReadFile(fence); err == nil {
		last, _ := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
		if token <= last {
			return fmt.Errorf("token %d not above the fence %d", token, last)
		}
	}
	if err := os.WriteFile(fence, []byte(strconv.FormatUint(token, 10)), 0o600); err != nil {
		return err
	}
	path := filepath.Join(dir, "counter")
	n := 0
	if b, err := os.ReadFile(path); err == nil {
		n, _ = strconv.Atoi(strings.TrimSpace(string(b)))
	}
	runtimeYield()
	return os.WriteFile(path, []byte(strconv.Itoa(n+1)), 0o600)
}
