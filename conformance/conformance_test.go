package conformance_test

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-locker/locker/conformance"
	"github.com/go-locker/locker/driver"
)

const (
	flawEnv    = "LOCKER_CONFORMANCE_FLAW"
	variantEnv = "LOCKER_CONFORMANCE_VARIANT"
)

// Variants of the flawed driver: with a BlockingAcquirer, package locker
// waits through it and never through the Waiter, so the Waiter's effect on
// package locker is checked on a driver without one.
const (
	blocking = "blocking" // every optional interface
	waiter   = "waiter"   // every optional interface but BlockingAcquirer
)

// mutant is a flawed driver and the subtest that must fail it.
type mutant struct{ flaw, failing, variant string }

// mutants lists, for every row of the trace table in the package
// documentation that names a subtest, a driver that breaks only that
// sentence; TestTraceTable checks that the two agree.
var mutants = []mutant{
	{"acquire-waits", "Driver/MutualExclusion", blocking},
	{"acquire-ignores-holder", "Driver/MutualExclusion", blocking},
	{"held-plain-error", "Driver/MutualExclusion", blocking},
	{"release-noop", "Driver/MutualExclusion", blocking},
	{"check-then-set", "Driver/AtomicAcquire", blocking},
	{"shared-scratch", "Driver/ConcurrentUse", blocking},
	{"keys-case-insensitive", "Driver/Keys", blocking},
	{"never-expires", "Driver/Expiry", blocking},
	{"expires-before-margin", "Driver/Expiry", blocking},
	{"acquire-fixed-ttl", "Driver/TTL", blocking},
	{"min-ttl-not-honoured", "Driver/Capabilities", blocking},
	{"honours-below-min", "Driver/Capabilities", blocking},
	{"granularity-rounds-down", "Driver/Capabilities", blocking},
	{"release-without-owner-check", "Driver/Ownership", blocking},
	{"refresh-without-owner-check", "Driver/Ownership", blocking},
	{"owner-prefix-compare", "Driver/Ownership", blocking},
	{"foreign-refresh-extends", "Driver/Ownership", blocking},
	{"owner-bound-to-locker", "Driver/OwnerAcrossLockers", blocking},
	{"locker-bound-release-frees", "Driver/OwnerAcrossLockers", blocking},
	{"refresh-ignores-ttl", "Driver/RefreshTTL", blocking},
	{"refresh-only-extends", "Driver/RefreshTTL", blocking},
	{"refresh-revives-expired", "Driver/RefreshDoesNotRevive", blocking},
	{"refresh-free-creates", "Driver/NotHeld", blocking},
	{"release-free-returns-nil", "Driver/NotHeld", blocking},
	{"notheld-plain-error", "Driver/NotHeld", blocking},
	{"release-expired-returns-nil", "Driver/Expired", blocking},
	{"inspect-sees-expired", "Driver/Expired", blocking},
	{"reacquire-revives-expired", "Driver/Expired", blocking},
	{"tokens-repeat-after-expiry", "Driver/Fencing", blocking},
	{"tokens-per-locker", "Driver/Fencing", blocking},
	{"tokens-reset-on-release", "Driver/Fencing", blocking},
	{"idempotent-refused", "Driver/IdempotentAcquire", blocking},
	{"idempotent-new-token", "Driver/IdempotentAcquire", blocking},
	{"idempotent-keeps-ttl", "Driver/IdempotentAcquire", blocking},
	{"idempotent-only-extends", "Driver/IdempotentAcquire", blocking},
	{"ignores-context", "Driver/Context", blocking},
	{"done-ctx-acquire-grants", "Driver/Context", blocking},
	{"release-empty-key-not-invalid", "Driver/BadInput", blocking},
	{"refresh-accepts-bad-ttl", "Driver/BadInput", blocking},
	{"close-twice-errors", "Driver/Close", blocking},
	{"closed-optional-calls-work", "Driver/Close", blocking},
	{"close-keeps-renewing", "Driver/Close", blocking},
	{"errors-prefixed-locker", "Driver/Errors", blocking},
	{"helderror-full-ttl", "Driver/HeldError", blocking},
	{"waiter-never-wakes", "Driver/Waiter", blocking},
	{"subscribe-registers-late", "Driver/Waiter", blocking},
	{"waiter-wakes-once", "Driver/Waiter", blocking},
	{"waiter-wakes-late", "Driver/Waiter", blocking},
	{"waiter-unbuffered", "Driver/Waiter", blocking},
	{"waiter-cancel-noop", "Driver/Waiter", blocking},
	{"subscribe-ignores-ctx", "Driver/Waiter", blocking},
	{"waiter-no-expiry-wake", "Driver/WaiterExpiry", blocking},
	{"blocking-grants-while-held", "Driver/BlockingAcquirer", blocking},
	{"blocking-late", "Driver/BlockingAcquirer", blocking},
	{"blocking-ignores-ttl", "Driver/BlockingAcquirer", blocking},
	{"blocking-waits-for-self", "Driver/BlockingAcquirer", blocking},
	{"blocking-ignores-ctx", "Driver/BlockingAcquirer", blocking},
	{"blocking-stays-queued", "Driver/BlockingAcquirer", blocking},
	{"blocking-no-expiry", "Driver/BlockingExpiry", blocking},
	{"inspect-wrong-token", "Driver/Inspector", blocking},
	{"inspect-free-not-notheld", "Driver/Inspector", blocking},
	{"inspect-extends", "Driver/Inspector", blocking},
	{"ping-fails", "Driver/Pinger", blocking},
	{"batch-foreign-extends", "Driver/BatchRefresh", blocking},
	{"batch-error-spreads", "Driver/BatchRefresh", blocking},
	{"batch-keeps-ttl", "Driver/BatchRefresh", blocking},
	{"batch-ignores-context", "Driver/BatchRefresh", blocking},
	{"watch-false-alarm", "Driver/HoldWatcher", blocking},
	{"watch-alarm-on-own-change", "Driver/HoldWatcher", blocking},
	{"watch-alarm-on-release", "Driver/HoldWatcher", blocking},
	{"watch-stop-twice-panics", "Driver/HoldWatcher", blocking},
	{"watch-early-alarm", "Driver/HoldWatcherExpiry", blocking},
	{"watch-lost-twice", "Driver/HoldWatcherExpiry", blocking},
	{"watch-lost-plain-error", "Driver/HoldWatcherExpiry", blocking},
	{"watch-stop-waits-for-lost", "Driver/HoldWatcherExpiry", blocking},

	// Faults (the fault subtests).
	{"frees-on-cut", "Faults/Cut", blocking},
	{"lost-late", "Faults/Cut", blocking},
	{"empty-restart-resets-tokens", "Faults/RestartEmpty", blocking},

	// Directed faults.
	{"lost-reply-not-acquired", "Faults/LostReply", blocking},
	{"restart-renumbers-tokens", "Faults/InspectAfterRestart", blocking},
	{"inspect-ghost-after-empty-restart", "Faults/InspectAfterRestartEmpty", blocking},
	{"reset-reasserts", "Faults/ServerAgrees", blocking},
	{"watch-alarm-on-reset", "Faults/WatchAcrossReset", blocking},
	{"watch-misses-empty-restart", "Faults/WatchRestartEmpty", blocking},
	{"waiter-deaf-after-reset", "Faults/WaitAcrossReset", waiter},
	{"waiter-deaf-after-restart", "Faults/WaitAcrossRestart", waiter},
	{"refresh-ok-on-timeout", "Faults/RefreshUnderCut", blocking},
	{"heal-reasserts", "Faults/RestartWhileCut", blocking},

	// Directed faults, planted in the TCP reference driver (tcpref_*_test.go),
	// which reaches its server over TCP and whose hooks are real faults.
	{"tcp-lost-reply-not-acquired", "Faults/LostReply", tcpVariant},
	{"tcp-restart-renumbers-tokens", "Faults/InspectAfterRestart", tcpVariant},
	{"tcp-inspect-ghost-after-empty-restart", "Faults/InspectAfterRestartEmpty", tcpVariant},
	{"tcp-reset-reasserts", "Faults/ServerAgrees", tcpVariant},
	{"tcp-waiter-deaf-after-reset", "Faults/WaitAcrossReset", tcpVariant},
	{"tcp-waiter-deaf-wakes-late", "Faults/WaitAcrossReset", tcpVariant},
	{"tcp-waiter-deaf-after-restart", "Faults/WaitAcrossRestart", tcpVariant},
	{"tcp-refresh-ok-on-timeout", "Faults/RefreshUnderCut", tcpVariant},

	// Package locker's promises, broken through the driver.
	{"held-plain-error", "Locker/TryAcquire", blocking},
	{"tokens-reset-on-release", "Locker/Fencing", blocking},
	{"min-ttl-not-honoured", "Locker/TTL", blocking},
	{"waiter-never-wakes", "Locker/WokenByRelease", waiter},
	{"waiter-storm", "Locker/WokenByRelease", waiter},
	{"blocking-late", "Locker/WokenByRelease", blocking},
	{"expires-before-margin", "Locker/LostOnExpiry", blocking},
	{"refresh-noop", "Locker/AutoRenew", blocking},
	{"blocking-stays-queued", "Locker/CancelledWait", blocking},
	{"blocking-stays-queued", "Locker/CloseRaces", blocking},
	{"acquire-ignores-holder", "Locker/Contention", blocking},
	{"release-noop", "Locker/Close", blocking},
}

// TestSuiteCatchesBrokenDrivers runs the suite against drivers that each
// break one sentence of the contract, in a child process (a failing suite
// must fail its own *testing.T) that runs only the subtest the sentence
// maps to, and checks that the subtest fails. The same driver without a
// flaw, in both variants, must pass the whole suite: the suite has no false
// positives on a correct driver.
func TestSuiteCatchesBrokenDrivers(t *testing.T) {
	if flaw := os.Getenv(flawEnv); flaw != "" && os.Getenv(variantEnv) == sharedVariant {
		runShared(t, flaw)
		return
	}
	if flaw := os.Getenv(flawEnv); flaw != "" && os.Getenv(variantEnv) == tcpVariant {
		conformance.Run(t, tcpHarness(t, flaw)) // the TCP reference driver (tcpref_test.go)
		return
	}
	if flaw := os.Getenv(flawEnv); flaw != "" && os.Getenv(variantEnv) == electionVariant {
		runElection(t, flaw)
		return
	}
	if flaw := os.Getenv(flawEnv); flaw != "" {
		st := newFlawStore(flaw)
		blockingVariant := os.Getenv(variantEnv) != waiter
		conformance.Run(t, conformance.Harness{
			Open: func(context.Context) (driver.Locker, error) {
				f := &flawed{st: st}
				if blockingVariant {
					return flawedBlocking{f}, nil
				}
				return f, nil
			},
			Cut:          func(d driver.Locker) (func(), error) { return asFlawed(d).cutOff() },
			Reset:        func(d driver.Locker) error { asFlawed(d).resetConns(); return nil },
			Restart:      func(context.Context) error { st.restart(false); return nil },
			RestartEmpty: func(context.Context) error { st.restart(true); return nil },
		})
		return
	}
	cases := append([]mutant{{"none", "", blocking}, {"none", "", waiter}, {"none", "", sharedVariant}}, mutants...)
	// Child processes run side by side, a few at a time: each mostly waits
	// for TTLs, and the correct driver's runs must stay free of timing
	// noise.
	sem := make(chan struct{}, 4)
	var wg sync.WaitGroup
	for _, c := range cases {
		name := c.flaw + "/" + c.variant
		if c.failing != "" {
			name = c.flaw + "/" + c.failing
		}
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			t.Run(name, func(t *testing.T) { runMutant(t, c) })
		})
	}
	wg.Wait()
}

func runMutant(t *testing.T, c mutant) {
	run := "^TestSuiteCatchesBrokenDrivers$"
	if c.failing != "" {
		group, sub, _ := strings.Cut(c.failing, "/")
		run += "/^" + group + "$/^" + sub + "$"
	}
	cmd := exec.Command(os.Args[0], "-test.run="+run, "-test.v", "-test.count=1", "-test.timeout=10m")
	cmd.Env = append(os.Environ(), flawEnv+"="+c.flaw, variantEnv+"="+c.variant)
	out, err := cmd.CombinedOutput()
	if c.failing == "" {
		if err != nil {
			t.Fatalf("the suite failed the %s driver without a flaw: %v\n%s", c.variant, err, out)
		}
		return
	}
	if err == nil {
		t.Fatalf("%s passed a driver whose flaw is %q\n%s", c.failing, c.flaw, out)
	}
	want := "--- FAIL: TestSuiteCatchesBrokenDrivers/" + c.failing + " "
	if !strings.Contains(string(out), want) {
		t.Fatalf("the suite failed flaw %q, but not at %s:\n%s", c.flaw, c.failing, out)
	}
}

// TestTraceTable checks the trace table in the package documentation
// against the mutants: every row that names a subtest names its mutants,
// each of which is in the list above with that subtest, and every mutant
// serves a row.
func TestTraceTable(t *testing.T) {
	src, err := os.ReadFile("doc.go")
	if err != nil {
		t.Fatal(err)
	}
	rows := tableRows(string(src))
	if len(rows) == 0 {
		t.Fatal("no rows found in doc.go's trace table")
	}
	rowRe := regexp.MustCompile(`→ ((?:Driver|Locker|Faults)/\w+)\b`)
	mutRe := regexp.MustCompile(`; mutants?: ([a-z0-9-]+(?:, [a-z0-9-]+)*)`)
	used := map[mutant]bool{}
	checked, noMutant, reasons, refs := 0, 0, 0, 0
	for _, row := range rows {
		sub := rowRe.FindStringSubmatch(row)
		if sub == nil {
			switch {
			case strings.Contains(row, "→ not checked: "):
				reasons++
			case strings.Contains(row, "→ see "):
				refs++
			default:
				t.Errorf("row names neither a subtest, nor the rows that cover it, nor why it is not checked: %s", row)
			}
			continue
		}
		checked++
		m := mutRe.FindStringSubmatch(row)
		if m == nil && strings.Contains(row, "; no driver mutant: ") {
			noMutant++
			continue
		}
		if m == nil {
			t.Errorf("row names subtest %s but no mutant: %s", sub[1], row)
			continue
		}
		for _, flaw := range strings.Split(m[1], ", ") {
			i := slices.IndexFunc(mutants, func(c mutant) bool { return c.flaw == flaw && c.failing == sub[1] })
			if i < 0 {
				t.Errorf("row's mutant %q failing at %s is not in the mutants list: %s", flaw, sub[1], row)
				continue
			}
			used[mutants[i]] = true
		}
	}
	for _, c := range mutants {
		if !used[c] {
			t.Errorf("mutant %q (%s) serves no row of the trace table", c.flaw, c.failing)
		}
	}
	t.Logf("trace table: %d rows: %d name a subtest (%d of them with no driver mutant, which says why), "+
		"%d point to other rows, %d say why they are not checked; %d mutants", len(rows), checked, noMutant, refs, reasons, len(mutants))
}

// tableRows returns the rows of the trace table: the list items of doc.go
// that start with a row id in brackets, continuation lines joined.
func tableRows(src string) []string {
	var rows []string
	in := false
	for _, line := range strings.Split(src, "\n") {
		text := strings.TrimPrefix(line, "//")
		switch {
		case strings.HasPrefix(text, "   - ["):
			rows = append(rows, strings.TrimSpace(strings.TrimPrefix(text, "   - ")))
			in = true
		case in && strings.HasPrefix(text, "     ") && strings.TrimSpace(text) != "":
			rows[len(rows)-1] += " " + strings.TrimSpace(text)
		default:
			in = false
		}
	}
	return rows
}

// asFlawed returns the flawed driver behind a Locker that Open returned.
func asFlawed(d driver.Locker) *flawed {
	if b, ok := d.(flawedBlocking); ok {
		return b.flawed
	}
	return d.(*flawed)
}

const harnessEnv = "LOCKER_CONFORMANCE_HARNESS"

// TestSuiteBadHarness runs the suite, in a child process, with a Harness
// that is wrong, and checks that it fails at once with a clear message: a
// fault hook without Open, and a hook that returns an error (the subtest
// fails with the hook's error, without hanging or skipping).
func TestSuiteBadHarness(t *testing.T) {
	switch os.Getenv(harnessEnv) {
	case "":
	case "no-open":
		conformance.Run(t, conformance.Harness{Reset: func(driver.Locker) error { return nil }})
		return
	case "hook-error":
		st := newFlawStore("none")
		conformance.Run(t, conformance.Harness{
			Open:  func(context.Context) (driver.Locker, error) { return flawedBlocking{&flawed{st: st}}, nil },
			Reset: func(driver.Locker) error { return errors.New("staged reset failed") },
		})
		return
	}
	for _, c := range []struct{ harness, run, want string }{
		{"no-open", "^TestSuiteBadHarness$", "conformance: Harness has fault hooks but no Open"},
		{"hook-error", "^TestSuiteBadHarness$/^Faults$/^Reset$", "fault hook Reset failed: staged reset failed"},
	} {
		t.Run(c.harness, func(t *testing.T) {
			cmd := exec.Command(os.Args[0], "-test.run="+c.run, "-test.v", "-test.count=1", "-test.timeout=2m")
			cmd.Env = append(os.Environ(), harnessEnv+"="+c.harness)
			start := time.Now()
			out, err := cmd.CombinedOutput()
			if err == nil {
				t.Fatalf("the suite passed a Harness that is wrong (%s):\n%s", c.harness, out)
			}
			if !strings.Contains(string(out), c.want) {
				t.Fatalf("the suite failed, but without %q:\n%s", c.want, out)
			}
			if strings.Contains(string(out), "--- SKIP") {
				t.Fatalf("the suite skipped instead of failing:\n%s", out)
			}
			if d := time.Since(start); d > time.Minute {
				t.Fatalf("the suite took %v to fail", d)
			}
		})
	}
}
