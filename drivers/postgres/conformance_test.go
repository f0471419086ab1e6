package postgres

import (
	"context"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/go-locker/locker/internal/pgtest"
)

// EnvURL names the environment variable that points the tests that do not
// kill or restart their server at an existing PostgreSQL instead of a
// private one.
const EnvURL = "LOCKER_TEST_POSTGRES_URL"

var (
	sharedOnce sync.Once
	sharedSrv  *pgtest.Server
	sharedErr  error
)

func TestMain(m *testing.M) {
	if runChild() {
		return
	}
	code := m.Run()
	if sharedSrv != nil {
		sharedSrv.Close()
	}
	os.Exit(code)
}

// serverURL returns the URL of a server the test may use but must not kill
// or restart: $LOCKER_TEST_POSTGRES_URL, or a private server started for the
// first test that asks (and kept for the package's tests).
func serverURL(t testing.TB) string {
	t.Helper()
	if u := os.Getenv(EnvURL); u != "" {
		return u
	}
	sharedOnce.Do(func() { sharedSrv, sharedErr = pgtest.Launch("max_connections=400") })
	if sharedErr != nil {
		t.Fatalf("starting PostgreSQL: %v", sharedErr)
	}
	return sharedSrv.URL()
}

func openT(t testing.TB, url string) *Locker {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	l, err := Open(ctx, url)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { _ = l.Close() })
	return l
}
