package main

import (
	"context"
	"fmt"
	"io"
	"sync/atomic"

	"github.com/redis/go-redis/v9"
)

// Client libraries log on their own; the command keeps its promise of one
// line per error by routing their logs to stderr only with -v.

// libLog receives go-redis's log lines.
type libLog struct{ w atomic.Pointer[io.Writer] }

var redisLog libLog

func init() { redis.SetLogger(&redisLog) }

// Printf implements go-redis's logger.
func (l *libLog) Printf(_ context.Context, format string, v ...any) {
	if w := l.w.Load(); w != nil {
		fmt.Fprintf(*w, "locker: redis client: "+format+"\n", v...)
	}
}

// showLibraryLogs sends client libraries' logs to w (with -v).
func showLibraryLogs(w io.Writer) { redisLog.w.Store(&w) }
