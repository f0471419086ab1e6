package tablelock_test

import (
	"context"
	"testing"
	"time"

	"github.com/go-locker/locker/conformance"
	"github.com/go-locker/locker/driver"

	"github.com/go-locker/locker/docs/tablelock"
)

func TestConformance(t *testing.T) {
	table := tablelock.NewTable() // one "server" for every Locker of the run
	conformance.Run(t, conformance.Harness{
		Open: func(ctx context.Context) (driver.Locker, error) {
			return tablelock.New(ctx, table, nil)
		},
		MinTTL: 100 * time.Millisecond,
	})
}
