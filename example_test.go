package locker_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/drivers/mem"
)

func ExampleOpenURL() {
	// The URL's scheme picks the driver; a blank import registers it.
	// Switching to Redis is a matter of "redis://host:6379/0".
	l, err := locker.OpenURL("mem://example-open")
	if err != nil {
		log.Fatal(err)
	}
	defer l.Close()
	fmt.Println(locker.Drivers()[0] != "")
	// Output: true
}

func ExampleLocker_Acquire() {
	l, err := locker.OpenURL("mem://example-acquire")
	if err != nil {
		log.Fatal(err)
	}
	defer l.Close()
	ctx := context.Background()

	lk, err := l.Acquire(ctx, "reports/nightly", locker.WithTTL(10*time.Second))
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("holding", lk.Key())

	// Another process trying at the same time is turned away.
	other, _ := locker.OpenURL("mem://example-acquire")
	defer other.Close()
	_, err = other.TryAcquire(ctx, "reports/nightly")
	fmt.Println("other:", errors.Is(err, locker.ErrNotAcquired))

	if err := lk.Release(ctx); err != nil {
		log.Fatal(err)
	}
	fmt.Println("released")
	// Output:
	// holding reports/nightly
	// other: true
	// released
}

func ExampleLocker_Do() {
	l, err := locker.OpenURL("mem://example-do")
	if err != nil {
		log.Fatal(err)
	}
	defer l.Close()

	// Four workers, one lock: the job body never runs twice at once.
	var wg sync.WaitGroup
	var mu sync.Mutex
	runs := 0
	for range 4 {
		wg.Go(func() {
			err := l.Do(context.Background(), "migrate", func(ctx context.Context) error {
				// ctx is cancelled if the lock is lost: stop work then.
				mu.Lock()
				runs++
				mu.Unlock()
				return nil
			})
			if err != nil {
				log.Print(err)
			}
		})
	}
	wg.Wait()
	fmt.Println("runs:", runs)
	// Output: runs: 4
}

// store is a resource that fences off stale lock holders: it remembers the
// highest token it has seen and rejects writes carrying a lower one.
type store struct {
	mu      sync.Mutex
	highest uint64
	value   string
}

func (s *store) Write(token uint64, v string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if token < s.highest {
		return fmt.Errorf("stale token %d < %d: rejected", token, s.highest)
	}
	s.highest, s.value = token, v
	return nil
}

func ExampleLock_Token() {
	l, err := locker.OpenURL("mem://example-fencing")
	if err != nil {
		log.Fatal(err)
	}
	defer l.Close()
	ctx := context.Background()
	res := &store{}

	// Client 1 takes the lock, then stalls (a GC pause, say) past its TTL
	// without noticing, so its lock expires.
	first, _ := l.Acquire(ctx, "file", locker.WithTTL(50*time.Millisecond), locker.WithAutoRenew(false))
	<-first.Lost()

	// Client 2 gets the lock and writes.
	second, _ := l.Acquire(ctx, "file")
	fmt.Println(res.Write(second.Token(), "from client 2"))

	// Client 1 wakes up and writes with its old token: the resource refuses.
	fmt.Println(res.Write(first.Token(), "from client 1") != nil)
	fmt.Println(res.value)
	second.Release(ctx)
	// Output:
	// <nil>
	// true
	// from client 2
}

func ExampleLock_Lost() {
	l, err := locker.OpenURL("mem://example-lost")
	if err != nil {
		log.Fatal(err)
	}
	defer l.Close()
	lk, _ := l.Acquire(context.Background(), "job", locker.WithTTL(30*time.Millisecond), locker.WithAutoRenew(false))
	select {
	case <-lk.Lost():
		fmt.Println("lost: stop touching the resource")
	case <-time.After(10 * time.Second):
		fmt.Println("still held")
	}
	// Output: lost: stop touching the resource
}

// Metrics go to an OpenTelemetry MeterProvider (here an SDK one with a
// manual reader; by default the global provider), losses and failed
// renewals to a slog.Logger, and keys are reported by a low-cardinality
// name of the program's choosing.
func ExampleWithMeterProvider() {
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	logger := slog.New(slog.NewTextHandler(os.Stdout, &slog.HandlerOptions{
		ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
			if a.Key == slog.TimeKey || a.Key == "token" {
				return slog.Attr{} // keep the output stable
			}
			return a
		},
	}))
	tenant := func(key string) string {
		if strings.HasPrefix(key, "tenant/") {
			return "tenant/*"
		}
		return ""
	}
	l := locker.New(mem.NewStore().Locker(),
		locker.WithMeterProvider(mp), locker.WithLogger(logger), locker.WithKeyName(tenant))
	ctx := context.Background()

	lk, err := l.Acquire(ctx, "tenant/42/report")
	if err != nil {
		log.Fatal(err)
	}
	_, err = l.TryAcquire(ctx, "tenant/42/report")
	fmt.Println("second try:", errors.Is(err, locker.ErrNotAcquired))
	l.Close() // releases the lock: Lost closes with CauseClosed
	fmt.Println("closed:", errors.Is(lk.Err(), locker.CauseClosed))

	var rm metricdata.ResourceMetrics
	if err := reader.Collect(ctx, &rm); err != nil {
		log.Fatal(err)
	}
	var lines []string
	for _, m := range rm.ScopeMetrics[0].Metrics {
		switch d := m.Data.(type) {
		case metricdata.Histogram[float64]:
			for _, p := range d.DataPoints {
				lines = append(lines, fmt.Sprintf("%s %v count=%d", m.Name, attrs(p.Attributes), p.Count))
			}
		case metricdata.Sum[int64]:
			for _, p := range d.DataPoints {
				lines = append(lines, fmt.Sprintf("%s %v value=%d", m.Name, attrs(p.Attributes), p.Value))
			}
		}
	}
	slices.Sort(lines)
	for _, line := range lines {
		fmt.Println(line)
	}
	// Output:
	// second try: true
	// level=INFO msg="locker: lock lost" driver=custom key=tenant/42/report cause=closed error="lock is not held (lost: closed): the Locker was closed"
	// closed: true
	// locker.acquire.duration locker.driver=custom,locker.key=tenant/*,locker.kind=mutex,locker.result=acquired count=1
	// locker.acquire.duration locker.driver=custom,locker.key=tenant/*,locker.kind=mutex,locker.result=not_acquired count=1
	// locker.held locker.driver=custom,locker.key=tenant/*,locker.kind=mutex value=0
	// locker.hold.duration locker.driver=custom,locker.key=tenant/*,locker.kind=mutex count=1
	// locker.lost locker.cause=closed,locker.driver=custom,locker.key=tenant/*,locker.kind=mutex value=1
}

// attrs prints an attribute set as k=v,k=v, in key order.
func attrs(set attribute.Set) string {
	var kvs []string
	for _, kv := range set.ToSlice() {
		kvs = append(kvs, string(kv.Key)+"="+kv.Value.String())
	}
	return strings.Join(kvs, ",")
}

// A job that hangs cannot keep its lock: at the max hold renewal stops,
// Lost closes (Do's context is cancelled) and the key is released.
func ExampleWithMaxHold() {
	l, err := locker.OpenURL("mem://example-max-hold")
	if err != nil {
		log.Fatal(err)
	}
	defer l.Close()
	ctx := context.Background()

	err = l.Do(ctx, "stuck-job", func(ctx context.Context) error {
		<-ctx.Done() // a job that would run forever
		return ctx.Err()
	}, locker.WithMaxHold(50*time.Millisecond))
	fmt.Println("max hold:", errors.Is(err, locker.CauseMaxHold))

	// The release is on its way: the next Acquire gets the key at once.
	lk, err := l.Acquire(ctx, "stuck-job")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("taken again:", lk.Token() > 1)
	lk.Release(ctx)
	// Output:
	// max hold: true
	// taken again: true
}

// A cron job that finished in no time keeps the key taken until the min
// hold has passed, so a host whose clock is a little behind does not run it
// again.
func ExampleWithMinHold() {
	l, err := locker.OpenURL("mem://example-min-hold")
	if err != nil {
		log.Fatal(err)
	}
	defer l.Close()
	ctx := context.Background()

	start := time.Now()
	err = l.Do(ctx, "cron/nightly", func(context.Context) error {
		return nil // done at once
	}, locker.WithMinHold(100*time.Millisecond))
	fmt.Println("job:", err)

	_, err = l.TryAcquire(ctx, "cron/nightly")
	fmt.Println("right after, taken:", errors.Is(err, locker.ErrNotAcquired))

	lk, err := l.Acquire(ctx, "cron/nightly") // waits for the min hold
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("free after the min hold:", time.Since(start) >= 100*time.Millisecond)
	lk.Release(ctx)
	// Output:
	// job: <nil>
	// right after, taken: true
	// free after the min hold: true
}
