package redis

import (
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/go-locker/locker/driver"
)

func TestParseURL(t *testing.T) {
	c, err := parseURL("redis://user:pw@h1:7000,h2,[::1]:7002/3?prefix=app&dial_timeout=1s&read_timeout=2s&write_timeout=3s&pool_size=7&client_name=x&node_timeout=30ms&allow_replica=true")
	if err != nil {
		t.Fatal(err)
	}
	if c.Mode() != "redlock" || strings.Join(c.Addrs, " ") != "h1:7000 h2:6379 [::1]:7002" || c.DB != 3 ||
		c.Username != "user" || c.Password != "pw" || c.Options.Prefix != "app" || c.DialTimeout != time.Second ||
		c.readTimeout != 2*time.Second || c.writeTimeout != 3*time.Second || c.poolSize != 7 || c.ClientName != "x" ||
		c.Options.NodeTimeout != 30*time.Millisecond || !c.AllowReplica || c.TLS {
		t.Fatalf("%+v", c)
	}
	for dsn, mode := range map[string]string{
		"redis://":                               "single",
		"redis://h:1":                            "single",
		"rediss://h:1?insecure_skip_verify=true": "single",
		"redis://a:1,b:2?cluster=true":           "cluster",
		"redis://a:1?cluster=true":               "cluster",
		"redis://s1:26379,s2?sentinel_master=m":  "sentinel",
		"redis://a:1,b:2,c:3":                    "redlock",
		"redis://s:1?sentinel_master=m&sentinel_password=p&sentinel_username=u": "sentinel",
	} {
		c, err := parseURL(dsn)
		if err != nil {
			t.Errorf("%s: %v", dsn, err)
			continue
		}
		if c.Mode() != mode {
			t.Errorf("%s: mode %s, want %s", dsn, c.Mode(), mode)
		}
	}
	if c, _ := parseURL("rediss://h:1"); !c.TLS || c.tlsConfig() == nil || c.nodeOptions("h:1").TLSConfig == nil {
		t.Fatal("rediss does not enable TLS")
	}
}

func TestParseURLErrors(t *testing.T) {
	for dsn, want := range map[string]string{
		"redis://h:1?bogus=1":                         "unknown query parameter(s) bogus",
		"redis://h:1?cluster=true&sentinel_master=m":  "mutually exclusive",
		"redis://h:1/1?cluster=true":                  "only database 0",
		"http://h:1":                                  "scheme",
		"redis://h:99999":                             "port",
		"redis://h:1,,h:2":                            "empty host",
		"redis://h:1,h:1":                             "listed twice",
		"redis://h:1/x":                               "database number",
		"redis://h:1?cluster=maybe":                   "true or false",
		"redis://h:1?dial_timeout=0s":                 "positive",
		"redis://h:1?pool_size=-1":                    "positive integer",
		"redis://h:1?sentinel_password=p":             "need sentinel_master",
		"redis://h:1?allow_replica=true&cluster=true": "single-node",
		"redis://h:1?insecure_skip_verify=true":       "rediss",
		"redis://h:1?prefix={x}":                      "prefix",
		"redis://h:1?node_timeout=1&node_timeout=2":   "given 2 times",
		"redis://:secret@h:1?max_key_len=x":           "max_key_len",
		"redis://:secret@h:1%zz":                      "malformed",
	} {
		_, err := parseURL(dsn)
		if !errors.Is(err, driver.ErrInvalid) || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want ErrInvalid mentioning %q", dsn, err, want)
		}
		if err != nil && strings.Contains(err.Error(), "secret") {
			t.Errorf("%s: error leaks the password: %v", dsn, err)
		}
		if err != nil && strings.HasPrefix(err.Error(), "locker:") {
			t.Errorf("%s: error has the locker: prefix", dsn)
		}
	}
}

func itoa(n int) string { return strconv.Itoa(n) }

func strconvAtoi64(s string) (int64, error) { return strconv.ParseInt(s, 10, 64) }
