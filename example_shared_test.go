package locker_test

import (
	"context"
	"fmt"
	"log"
	"sync"
	"sync/atomic"

	"github.com/go-locker/locker"
)

func ExampleLocker_Semaphore() {
	l, err := locker.OpenURL("mem://example-semaphore")
	if err != nil {
		log.Fatal(err)
	}
	defer l.Close()
	ctx := context.Background()

	uploads := l.Semaphore("uploads", 2) // at most 2 uploads at once
	var running, peak atomic.Int32
	var wg sync.WaitGroup
	for range 6 {
		wg.Go(func() {
			err := uploads.Do(ctx, func(ctx context.Context) error {
				n := running.Add(1)
				for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
				}
				running.Add(-1)
				return nil
			})
			if err != nil {
				log.Fatal(err)
			}
		})
	}
	wg.Wait()
	fmt.Println("at most", peak.Load() <= 2)
	// Output: at most true
}

func ExampleRWMutex() {
	l, err := locker.OpenURL("mem://example-rwmutex")
	if err != nil {
		log.Fatal(err)
	}
	defer l.Close()
	ctx := context.Background()

	catalog := l.RWMutex("catalog")
	r1, _ := catalog.AcquireRead(ctx)
	r2, _ := catalog.AcquireRead(ctx) // readers share the lock
	holders, _ := catalog.Inspect(ctx)
	fmt.Println(len(holders), holders[0].Kind)

	_, err = catalog.TryAcquireWrite(ctx) // a writer waits for the readers
	fmt.Println(err != nil)
	r1.Release(ctx)
	r2.Release(ctx)

	w, err := catalog.AcquireWrite(ctx)
	if err != nil {
		log.Fatal(err)
	}
	// The writer's token is above every earlier reader's: pass it to the
	// catalog so that it rejects a stale writer.
	fmt.Println(w.Token() > r2.Token())
	w.Release(ctx)
	// Output:
	// 2 read
	// true
	// true
}
