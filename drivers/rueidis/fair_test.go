package rueidis

import (
	"os"
	"testing"

	"github.com/go-locker/locker/internal/redistest/drivertest"
)

func TestMain(m *testing.M) {
	drivertest.MaybeChild()
	os.Exit(m.Run())
}

// TestFair: the fair queue on rueidis (see drivertest.Fair).
func TestFair(t *testing.T) { drivertest.Fair(t, urls) }
