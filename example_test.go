package locker_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"sync"
	"time"

	"github.com/go-locker/locker"
	_ "github.com/go-locker/locker/drivers/mem"
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
