package locker_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/go-locker/locker"
)

func ExampleElection() {
	ctx, stop := context.WithTimeout(context.Background(), 10*time.Second)
	defer stop()
	l, err := locker.OpenURL("mem://example-election")
	if err != nil {
		log.Fatal(err)
	}
	defer l.Close()
	e := l.Election("scheduler")

	// An observer sees who leads; here it stops at the first leader.
	elected := make(chan locker.Leader, 1)
	go func() {
		for ld, err := range e.Observe(ctx) {
			if err == nil && ld.Term != 0 {
				elected <- ld
				return
			}
		}
	}()

	// Lead runs the function while this process leads. Its ctx is
	// cancelled if the lead is lost, before anyone else can be elected;
	// the term is a fencing token for every write the leader makes.
	err = e.Lead(ctx, "10.0.0.7:8080", func(ctx context.Context, term uint64) error {
		ld := <-elected
		fmt.Println("observer sees", ld.Value, "leading, same term:", ld.Term == term)
		return errDone // ends Lead; returning nil would campaign again
	})
	fmt.Println(err)
	_, err = e.Leader(ctx)
	fmt.Println("after Lead:", err)
	// Output:
	// observer sees 10.0.0.7:8080 leading, same term: true
	// done
	// after Lead: locker: leader "scheduler": no leader: lock is not held
}

var errDone = fmt.Errorf("done")
