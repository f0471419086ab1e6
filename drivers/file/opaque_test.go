package file

import (
	"os"
	"testing"
	"time"

	"github.com/go-locker/locker/internal/opaquetest"
)

// Keys and owners are opaque: with spaces, colons, newlines, braces, NUL
// and non-UTF-8 bytes, a waiter in another Locker is woken and granted
// within 100ms of the release, Inspect reports the exact owner, the hold
// watch reports the loss of such a grant, and no two keys interfere.
func TestOpaqueKeyHandoff(t *testing.T) {
	var h opaquetest.Handoffs
	defer func() { h.Check(t) }()
	dir := t.TempDir()
	a, b := open(t, dir), open(t, dir)
	ctx := ctxT(t)
	opaquetest.Run(t, ctx, &h, a, b, opaquetest.Config{
		TTL:  time.Minute,
		Lose: func(key string) error { return os.Remove(b.Path(key)) },
		Lost: "removed lock file",
	})
}
