package rediscore

import (
	"context"
	"errors"
	"testing"
	"time"
)

// A socket timeout reported just before ctx's deadline is reported as the
// deadline; anything else returns at once.
func TestCtxErrSettlesDeadline(t *testing.T) {
	ioTimeout := errors.New("read tcp 127.0.0.1:1->127.0.0.1:2: i/o timeout")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Millisecond)
	defer cancel()
	if err := prefix("redis").ctxErr(ctx, "subscribe", ioTimeout); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("ctxErr near the deadline = %v, want DeadlineExceeded", err)
	}

	far, cancel2 := context.WithTimeout(context.Background(), time.Minute)
	defer cancel2()
	start := time.Now()
	err := prefix("redis").ctxErr(far, "acquire", ioTimeout)
	if errors.Is(err, context.DeadlineExceeded) || time.Since(start) > time.Second {
		t.Fatalf("ctxErr far from the deadline = %v after %v, want the error at once", err, time.Since(start))
	}
	start = time.Now()
	SettleDeadline(context.Background(), ioTimeout) // no deadline: no wait
	if d := time.Since(start); d > time.Second {
		t.Fatalf("SettleDeadline without a deadline waited %v", d)
	}
}
