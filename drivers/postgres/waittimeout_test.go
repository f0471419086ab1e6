package postgres

import (
	"context"
	"fmt"
	"net/url"
	"strings"
	"testing"
	"time"
)

// A session's lock_timeout and statement_timeout only make a wait start
// over: a waiter whose session gives up every 100ms is still granted the
// key when the holder releases it, 1s later.
func TestWaitSurvivesSessionTimeouts(t *testing.T) {
	base := serverURL(t)
	sep := "?"
	if strings.Contains(base, "?") {
		sep = "&"
	}
	for _, setting := range []string{"lock_timeout", "statement_timeout"} {
		t.Run(setting, func(t *testing.T) {
			a := openT(t, base)
			b := openT(t, base+sep+"options="+url.QueryEscape("-c "+setting+"=100ms"))
			key := fmt.Sprintf("timeouts/%s/%d", setting, time.Now().UnixNano())
			if _, err := a.Acquire(ctxFor(t, 30*time.Second), key, "holder", time.Minute); err != nil {
				t.Fatal(err)
			}
			type res struct {
				at  time.Time
				err error
			}
			got := make(chan res, 1)
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			go func() {
				_, err := b.AcquireWait(ctx, key, "waiter", time.Minute)
				got <- res{time.Now(), err}
			}()
			select {
			case r := <-got:
				t.Fatalf("AcquireWait returned before the release: %v", r.err)
			case <-time.After(time.Second): // ten session timeouts
			}
			released := time.Now()
			if err := a.Release(ctxFor(t, 30*time.Second), key, "holder"); err != nil {
				t.Fatal(err)
			}
			r := <-got
			if r.err != nil {
				t.Fatalf("AcquireWait after %d ms of %s=100ms: %v", time.Since(released).Milliseconds(), setting, r.err)
			}
			t.Logf("granted %v after the release", r.at.Sub(released))
			_ = b.Release(ctxFor(t, 30*time.Second), key, "waiter")
		})
	}
}
