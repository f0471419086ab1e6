package file

import (
	"context"
	"testing"

	"github.com/go-locker/locker/conformance"
	"github.com/go-locker/locker/driver"
)

// TestConformance runs the suite on one directory; every Open is a separate
// Locker, as separate processes on the host would have.
func TestConformance(t *testing.T) {
	dir := t.TempDir()
	conformance.Run(t, conformance.Harness{
		Open: func(context.Context) (driver.Locker, error) { return Open("file://" + dir) },
	})
}
