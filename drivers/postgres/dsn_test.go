package postgres

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/go-locker/locker/driver"
	"github.com/jackc/pgx/v5/pgxpool"
)

func TestParseDSN(t *testing.T) {
	c, err := parseDSN("postgres://u:pw@db.example:6543/app?sslmode=disable&schema=locks&namespace=billing&pool_max_conns=7&application_name=x&options=-c%20search_path%3Dy")
	if err != nil {
		t.Fatal(err)
	}
	if c.schema != "locks" || c.namespace != "billing" || c.pool.MaxConns != 7 ||
		c.pool.ConnConfig.Host != "db.example" || c.pool.ConnConfig.Port != 6543 || c.pool.ConnConfig.Database != "app" {
		t.Fatalf("parsed %+v / %+v", c, c.pool.ConnConfig)
	}
	if got := c.pool.ConnConfig.RuntimeParams["options"]; got != "-c search_path=y" {
		t.Fatalf("options = %q, want %q", got, "-c search_path=y")
	}
	if _, ok := c.pool.ConnConfig.RuntimeParams["schema"]; ok {
		t.Fatal("our parameter leaked to pgx")
	}
	c, err = parseDSN("postgresql://h/db")
	if err != nil {
		t.Fatal(err)
	}
	if c.schema != DefaultSchema || c.namespace != DefaultNamespace || c.pool.MaxConns != DefaultPoolMaxConns {
		t.Fatalf("defaults: %+v", c)
	}
}

func TestParseDSNInvalid(t *testing.T) {
	for _, dsn := range []string{
		"postgres://h/db?bogus=1",
		"postgres://h/db?statement_timeout=5s", // a server setting: use options=-c
		"postgres://h/db?schema=",
		"postgres://h/db?schema=a&schema=b",
		"postgres://h/db?schema=" + strings.Repeat("s", 64),
		"mysql://h/db",
		"postgres://h/db?pool_max_conns=zero",
		"postgres://h/db?sslmode=sometimes",
		"://nope",
		"postgres://h/db?namespace=a%00b", // NUL: could collide (see AdvisoryKey)
	} {
		if _, err := parseDSN(dsn); !errors.Is(err, driver.ErrInvalid) {
			t.Errorf("parseDSN(%q) = %v, want ErrInvalid", dsn, err)
		}
	}
	_, err := parseDSN("postgres://u:secretpw@h/db?bogus=1")
	if err == nil || strings.Contains(err.Error(), "secretpw") {
		t.Errorf("error leaks the password: %v", err)
	}
}

// Open through the driver registry, with our own schema created on demand.
func TestOpenSchema(t *testing.T) {
	url := serverURL(t)
	schema := "locker_test_" + itoa(int(time.Now().UnixNano()%1e9))
	l := openT(t, url+"&schema="+schema+"&namespace=ns1")
	ctx := ctxFor(t, 30*time.Second)
	tok, err := l.Acquire(ctx, "k", "o", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if tok != 1 {
		t.Fatalf("first token of a fresh sequence = %d, want 1", tok)
	}
	var n int
	if err := poolT(t, url).QueryRow(ctx, `SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE n.nspname = $1 AND c.relname = $2 AND c.relkind = 'S'`, schema, SequenceName).Scan(&n); err != nil || n != 1 {
		t.Fatalf("sequence in schema %s: %d %v", schema, n, err)
	}
	// Another namespace does not see the lock; the same one does.
	other := openT(t, url+"&schema="+schema+"&namespace=ns2")
	if _, err := other.Acquire(ctx, "k", "o2", time.Minute); err != nil {
		t.Fatalf("other namespace: %v", err)
	}
	same := openT(t, url+"&schema="+schema+"&namespace=ns1")
	if _, err := same.Acquire(ctx, "k", "o3", time.Minute); !errors.Is(err, driver.ErrNotAcquired) {
		t.Fatalf("same namespace: %v, want ErrNotAcquired", err)
	}
	// Setup is idempotent, also when run concurrently.
	errs := make(chan error, 4)
	for range 4 {
		go func() {
			l, err := Open(ctx, url+"&schema="+schema+"x")
			if err == nil {
				l.Close()
			}
			errs <- err
		}()
	}
	for range 4 {
		if err := <-errs; err != nil {
			t.Fatalf("concurrent Open: %v", err)
		}
	}
}

// A sequence with a cache would hand each session its own block of values:
// tokens would not increase across sessions. Setup refuses it.
func TestSequenceWithCacheRefused(t *testing.T) {
	url := serverURL(t)
	schema := "locker_cache_" + itoa(int(time.Now().UnixNano()%1e9))
	ctx := ctxFor(t, 30*time.Second)
	p := poolT(t, url)
	if _, err := p.Exec(ctx, `CREATE SCHEMA `+schema+`; CREATE SEQUENCE `+schema+`.`+SequenceName+` CACHE 20`); err != nil {
		t.Fatal(err)
	}
	_, err := Open(ctx, url+"&schema="+schema)
	if err == nil || !strings.Contains(err.Error(), "CACHE 1") {
		t.Fatalf("Open with a cached sequence: %v", err)
	}
}

func TestNewAdoptsPool(t *testing.T) {
	url := serverURL(t)
	p := poolT(t, url)
	ctx := ctxFor(t, 30*time.Second)
	if _, err := New(ctx, nil, nil); !errors.Is(err, driver.ErrInvalid) {
		t.Fatalf("New(nil): %v", err)
	}
	for _, o := range []*Options{
		{Schema: strings.Repeat("s", 64)},
		{Mode: "Lease"},
		{Mode: ModeLease, SweepAge: -time.Second},
	} {
		if _, err := New(ctx, p, o); !errors.Is(err, driver.ErrInvalid) {
			t.Fatalf("New with %+v: %v, want ErrInvalid", *o, err)
		}
	}
	l, err := New(ctx, p, &Options{Namespace: "adopt"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.Acquire(ctx, "k", "o", time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	// Close left the user's pool open, and freed the lock (its session
	// ends asynchronously: wait in the server, bounded by ctx).
	var free bool
	if err := p.QueryRow(ctx, `SELECT pg_advisory_lock($1)::text = '' AND pg_advisory_unlock($1)`, AdvisoryKey("adopt", "k")).Scan(&free); err != nil || !free {
		t.Fatalf("pool after Close: %v %v", free, err)
	}
	if _, err := l.Acquire(context.Background(), "k", "o", time.Minute); !errors.Is(err, driver.ErrClosed) {
		t.Fatalf("after Close: %v", err)
	}
}

// A namespace with a NUL byte is refused by New too, before any I/O (the
// pool here points at nothing).
func TestNewNamespaceNUL(t *testing.T) {
	p, err := pgxpool.New(context.Background(), "postgres://127.0.0.1:1/none")
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	for _, mode := range []string{ModeAdvisory, ModeLease} {
		if _, err := New(context.Background(), p, &Options{Mode: mode, Namespace: "a\x00b"}); !errors.Is(err, driver.ErrInvalid) {
			t.Errorf("New with a NUL in the namespace (%s): %v, want ErrInvalid", mode, err)
		}
	}
}
