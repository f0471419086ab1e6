package redis

import (
	"testing"

	"github.com/go-locker/locker/internal/redistest/drivertest"
)

// TestFair: the fair queue on go-redis (see drivertest.Fair).
func TestFair(t *testing.T) { drivertest.Fair(t, urls) }
