package rueidis

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/go-locker/locker/driver"
	"github.com/go-locker/locker/internal/redistest"
)

func TestParseURL(t *testing.T) {
	c, err := parseURL("rueidis://user:pw@h1:7000/3?prefix=app&dial_timeout=2s&client_name=x&tls=true&node_timeout=20ms&drift_factor=0.02&max_key_len=10&token_retention=1h")
	if err != nil {
		t.Fatal(err)
	}
	if c.Username != "user" || c.Password != "pw" || c.DB != 3 || len(c.Addrs) != 1 || c.Addrs[0] != "h1:7000" ||
		c.DialTimeout != 2*time.Second || c.ClientName != "x" || !c.TLS || c.Options.Prefix != "app" ||
		c.Options.NodeTimeout != 20*time.Millisecond || c.Options.DriftFactor != 0.02 || c.Options.MaxKeyLen != 10 ||
		c.Options.TokenRetention != time.Hour || c.redlock() {
		t.Fatalf("parsed %+v", c)
	}
	if tc := c.tlsConfig(c.Addrs[0]); tc == nil || tc.ServerName != "h1" {
		t.Fatalf("tls config %+v", tc)
	}

	c, err = parseURL("rueidis://h1,h2:7001,[::1]:7002,[::2]")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(c.Addrs, " ") != "h1:6379 h2:7001 [::1]:7002 [::2]:6379" || !c.redlock() {
		t.Fatalf("hosts %v redlock %v", c.Addrs, c.redlock())
	}
	c, err = parseURL("rueidis://")
	if err != nil || c.Addrs[0] != "127.0.0.1:6379" || c.Options.Prefix != "locker" || c.DialTimeout != DefaultDialTimeout {
		t.Fatalf("defaults: %+v %v", c, err)
	}
	c, err = parseURL("rueidis://h1,h2?cluster=true")
	if err != nil || !c.Cluster || c.redlock() {
		t.Fatalf("cluster: %+v %v", c, err)
	}
	c, err = parseURL("rueidis://s1,s2?sentinel_master=m&sentinel_password=p&sentinel_username=u")
	if err != nil || c.SentinelMaster != "m" || c.SentinelPassword != "p" || c.SentinelUsername != "u" || c.redlock() {
		t.Fatalf("sentinel: %+v %v", c, err)
	}
}

func TestParseURLErrors(t *testing.T) {
	for _, dsn := range []string{
		"redis://h1",                       // wrong scheme
		"rueidis://h1?bogus=1",             // unknown parameter
		"rueidis://h1?cluster=maybe",       // bad bool
		"rueidis://h1?cluster=1&cluster=0", // repeated
		"rueidis://h1?cluster=true&sentinel_master=m",
		"rueidis://h1?sentinel_password=p", // needs sentinel_master
		"rueidis://h1/x",                   // bad db
		"rueidis://h1/1?cluster=true",      // cluster has db 0 only
		"rueidis://h1:99999",               // bad port
		"rueidis://h1,,h2",                 // empty host
		"rueidis://h1?dial_timeout=-1s",
		"rueidis://h1?dial_timeout=soon",
		"rueidis://h1?prefix=a{b}",
		"rueidis://h1?node_timeout=0s",
		"rueidis://h1?drift_factor=0.7",
		"rueidis://h1?max_key_len=-1",
		"rueidis://h1?client_name=",
		"rueidis://h1?cluster=true&allow_replica=true",
		"rueidis://:pw@h1:%zz", // malformed
		"rueidis:opaque",
		"rueidis://h1,h1",                        // duplicate
		"rueidis://h1?insecure_skip_verify=true", // needs tls

	} {
		c, err := parseURL(dsn)
		if err == nil {
			t.Errorf("parseURL(%q) = %+v, want an error", dsn, c)
			continue
		}
		if !errors.Is(err, driver.ErrInvalid) {
			t.Errorf("parseURL(%q) = %v, want ErrInvalid", dsn, err)
		}
		if strings.Contains(err.Error(), "pw") {
			t.Errorf("parseURL(%q) error leaks the password: %v", dsn, err)
		}
		// Open fails the same way, before any I/O.
		if _, oerr := Open(context.Background(), dsn); !errors.Is(oerr, driver.ErrInvalid) {
			t.Errorf("Open(%q) = %v, want ErrInvalid", dsn, oerr)
		}
	}
}

// The constructors' shape: New, NewRedlock and NewWithClientOption take a
// ctx and a *Options, nil meaning every default (TestNewDefaults); bad
// options, clients or client options are driver.ErrInvalid before any I/O.
func TestNewErrors(t *testing.T) {
	ctx := context.Background()
	if _, err := New(ctx, nil, nil); !errors.Is(err, driver.ErrInvalid) {
		t.Fatalf("New(nil): %v", err)
	}
	if _, err := NewRedlock(ctx, nil, nil); !errors.Is(err, driver.ErrInvalid) {
		t.Fatalf("NewRedlock(nil): %v", err)
	}
	if _, err := NewWithClientOption(ctx, rueidis.ClientOption{DisableCache: true}, nil); !errors.Is(err, driver.ErrInvalid) {
		t.Fatalf("NewWithClientOption(DisableCache): %v", err)
	}
	// The client options name a port nothing listens on: an error other
	// than ErrInvalid would mean NewWithClientOption tried I/O.
	refused := rueidis.ClientOption{InitAddress: []string{"127.0.0.1:" + strconv.Itoa(redistest.RefusedPort(t))}}
	for name, o := range map[string]*Options{
		"prefix":          {Prefix: "a{"},
		"node_timeout":    {NodeTimeout: -time.Second},
		"drift_factor":    {DriftFactor: 0.5},
		"max_key_len":     {MaxKeyLen: -1},
		"token_retention": {TokenRetention: -time.Second},
		"queue_ttl":       {QueueTTL: time.Millisecond},
	} {
		if _, err := New(ctx, nil, o); !errors.Is(err, driver.ErrInvalid) || !strings.HasPrefix(err.Error(), "rueidis: "+name) {
			t.Errorf("New with bad %s: %v", name, err)
		}
		if _, err := NewRedlock(ctx, nil, o); !errors.Is(err, driver.ErrInvalid) || !strings.HasPrefix(err.Error(), "rueidis: "+name) {
			t.Errorf("NewRedlock with bad %s: %v", name, err)
		}
		_, err := NewWithClientOption(ctx, refused, o)
		if !errors.Is(err, driver.ErrInvalid) || errors.Is(err, driver.ErrUnavailable) || !strings.HasPrefix(err.Error(), "rueidis: "+name) {
			t.Errorf("NewWithClientOption with bad %s: %v", name, err)
		}
	}
}
