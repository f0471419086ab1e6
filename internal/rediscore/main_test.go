package rediscore

import (
	"context"
	"os"
	"testing"

	"github.com/redis/go-redis/v9"
)

type quietLogger struct{}

func (quietLogger) Printf(context.Context, string, ...any) {}

func TestMain(m *testing.M) {
	redis.SetLogger(quietLogger{}) // dial failures to killed servers are expected
	os.Exit(m.Run())
}
