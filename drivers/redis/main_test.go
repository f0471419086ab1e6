package redis

import (
	"context"
	"os"
	"testing"

	goredis "github.com/redis/go-redis/v9"

	"github.com/go-locker/locker/internal/redistest/drivertest"
)

type quietLogger struct{}

func (quietLogger) Printf(context.Context, string, ...any) {}

func TestMain(m *testing.M) {
	drivertest.MaybeChild()
	goredis.SetLogger(quietLogger{}) // dial failures to killed servers are expected
	os.Exit(m.Run())
}
