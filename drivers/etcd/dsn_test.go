package etcd

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/go-locker/locker/driver"
)

func TestParseDSN(t *testing.T) {
	c, err := parseDSN("etcd://u:p%40ss@h1:2379,h2:2380/app/locks/?dial_timeout=2s&request_timeout=3s&keepalive_time=4s&keepalive_timeout=1s&auto_sync_interval=1m&min_ttl=5s")
	if err != nil {
		t.Fatal(err)
	}
	want := &config{
		endpoints:        []string{"h1:2379", "h2:2380"},
		prefix:           "/app/locks",
		username:         "u",
		password:         "p@ss",
		dialTimeout:      2 * time.Second,
		requestTimeout:   3 * time.Second,
		keepAliveTime:    4 * time.Second,
		keepAliveTimeout: time.Second,
		autoSync:         time.Minute,
		minTTL:           5 * time.Second,
	}
	if !reflect.DeepEqual(c, want) {
		t.Fatalf("got %+v\nwant %+v", c, want)
	}

	c, err = parseDSN("etcd://[::1]:2379")
	if err != nil {
		t.Fatal(err)
	}
	if c.prefix != DefaultPrefix || c.minTTL != DefaultMinTTL || c.requestTimeout != DefaultRequestTimeout ||
		c.dialTimeout != DefaultDialTimeout || c.tls != nil || c.endpoints[0] != "[::1]:2379" {
		t.Fatalf("defaults: %+v", c)
	}
	if c, err := parseDSN("etcd://h:1/?tls=true&server_name=etcd.local"); err != nil || c.tls == nil || c.tls.ServerName != "etcd.local" {
		t.Fatalf("tls: %+v %v", c, err)
	}
	if c, err := parseDSN("etcd://h:1/?insecure_skip_verify=true"); err != nil || c.tls == nil || !c.tls.InsecureSkipVerify {
		t.Fatalf("insecure_skip_verify: %+v %v", c, err)
	}
}

func TestParseDSNInvalid(t *testing.T) {
	dir := t.TempDir()
	notPEM := filepath.Join(dir, "ca.pem")
	if err := os.WriteFile(notPEM, []byte("not a certificate"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, dsn := range []string{
		"",
		"redis://h:1",
		"etcd:h:1",
		"etcd://",
		"etcd:///prefix",
		"etcd://h",
		"etcd://h:0",
		"etcd://h:99999",
		"etcd://:2379",
		"etcd://h:1,",
		"etcd://h:1#frag",
		"etcd://:pw@h:1",
		"etcd://h:1/a//b",
		"etcd://h:1/a/../b",
		"etcd://h:1/./b",
		"etcd://h:1/a/l/b",
		"etcd://h:1/w",
		"etcd://h:1/l/",
		"etcd://h:1/a/s",
		"etcd://h:1/rw/b",
		"etcd://h:1,h:1",
		"etcd://h:1?tls=false&ca_file=/x",
		"etcd://h:1?insecure_skip_verify=true&tls=false",
		"etcd://h:1?unknown=1",
		"etcd://h:1?dial_timeout=0s",
		"etcd://h:1?dial_timeout=abc",
		"etcd://h:1?request_timeout=-1s",
		"etcd://h:1?min_ttl=1500ms",
		"etcd://h:1?min_ttl=0s",
		"etcd://h:1?auto_sync_interval=-1s",
		"etcd://h:1?tls=maybe",
		"etcd://h:1?dial_timeout=1s&dial_timeout=2s",
		"etcd://h:1?cert_file=/x",
		"etcd://h:1?ca_file=/does/not/exist",
		"etcd://h:1?ca_file=" + notPEM,
		"etcd://h:1?%zz",
	} {
		_, err := parseDSN(dsn)
		if !errors.Is(err, driver.ErrInvalid) {
			t.Errorf("parseDSN(%q) = %v, want ErrInvalid", dsn, err)
			continue
		}
		if !strings.HasPrefix(err.Error(), "etcd: ") {
			t.Errorf("parseDSN(%q): error %q does not name the backend", dsn, err)
		}
		// Open rejects it the same way, before any I/O.
		if _, err := (Driver{}).Open(dsn); !errors.Is(err, driver.ErrInvalid) {
			t.Errorf("Open(%q) = %v, want ErrInvalid", dsn, err)
		}
	}
}

// A prefix is opaque bytes between its "/" separators: spaces, colons,
// newlines, braces and non-UTF-8 bytes are kept as they are.
func TestParseDSNOpaquePrefix(t *testing.T) {
	for dsn, want := range map[string]string{
		"etcd://h:1/a%20b":              "/a b",
		"etcd://h:1/a%00b":              "/a\x00b",
		"etcd://h:1/a%ffb/":             "/a\xffb",
		"etcd://h:1/t%3A1/%7Bx%7D%0Ay":  "/t:1/{x}\ny",
		"etcd://h:1/ll/ww/l1":           "/ll/ww/l1",
		"etcd://h:1/tenant%2042/report": "/tenant 42/report",
	} {
		c, err := parseDSN(dsn)
		if err != nil {
			t.Errorf("parseDSN(%q): %v", dsn, err)
		} else if c.prefix != want {
			t.Errorf("parseDSN(%q): prefix %q, want %q", dsn, c.prefix, want)
		}
	}
}

// An unknown parameter is named in the one error, before any file named by
// another parameter is read.
func TestParseDSNUnknownFirst(t *testing.T) {
	_, err := parseDSN("etcd://h:1/p?ca_file=/does/not/exist&bogus=1")
	if !errors.Is(err, driver.ErrInvalid) || !strings.Contains(err.Error(), `unknown query parameter "bogus"`) {
		t.Fatalf("parseDSN with an unknown parameter and a missing ca_file: %v", err)
	}
}

func TestParseDSNHidesPassword(t *testing.T) {
	_, err := parseDSN("etcd://user:secret@h:1/%zz")
	if err == nil || strings.Contains(err.Error(), "secret") {
		t.Fatalf("error %v leaks the password", err)
	}
}
