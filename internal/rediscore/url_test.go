package rediscore

import (
	"errors"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/go-locker/locker/driver"
)

// The two drivers' specs, as drivers/redis and drivers/rueidis set them up
// (their own tests check their parseURL end to end).

type redisExtra struct {
	read, write time.Duration
	pool        int
}

func redisSpec(x *redisExtra) URLSpec {
	return URLSpec{
		Driver: "redis", Schemes: []string{"redis", "rediss"}, WantSchemes: "redis or rediss",
		DialTimeout: 5 * time.Second,
		TLS: func(u *URL, _ *Query) error {
			u.TLS = u.Scheme == "rediss"
			return nil
		},
		TLSHint: "the rediss scheme",
		Params: func(q *Query) error {
			if err := q.Duration("read_timeout", &x.read); err != nil {
				return err
			}
			if err := q.Duration("write_timeout", &x.write); err != nil {
				return err
			}
			return q.PositiveInt("pool_size", &x.pool)
		},
	}
}

var rueidisSpec = URLSpec{
	Driver: "rueidis", Schemes: []string{"rueidis"}, WantSchemes: `"rueidis"`,
	DialTimeout: 5 * time.Second,
	TLS:         func(u *URL, q *Query) error { return q.Bool("tls", &u.TLS) },
	TLSHint:     "tls=true",
}

func TestParseURLShared(t *testing.T) {
	var x redisExtra
	u, err := ParseURL("redis://user:pw@h1:7000,h2,[::1]:7002/3?prefix=app&dial_timeout=1s&read_timeout=2s&write_timeout=3s&pool_size=7&client_name=x&node_timeout=30ms&allow_replica=true", redisSpec(&x))
	if err != nil {
		t.Fatal(err)
	}
	if u.Mode() != "redlock" || strings.Join(u.Addrs, " ") != "h1:7000 h2:6379 [::1]:7002" || u.DB != 3 ||
		u.Username != "user" || u.Password != "pw" || u.Options.Prefix != "app" || u.DialTimeout != time.Second ||
		x.read != 2*time.Second || x.write != 3*time.Second || x.pool != 7 || u.ClientName != "x" ||
		u.Options.NodeTimeout != 30*time.Millisecond || !u.AllowReplica || u.TLS || u.Scheme != "redis" {
		t.Fatalf("%+v %+v", u, x)
	}
	if !u.Options.Barging {
		t.Fatal("a Redlock URL must barge (no queue)")
	}
	for dsn, barging := range map[string]bool{"redis://h": false, "redis://h?fair=false": true, "redis://h?fair=true": false, "redis://h1,h2,h3?fair=false": true} {
		u, err := ParseURL(dsn, redisSpec(&x))
		if err != nil || u.Options.Barging != barging {
			t.Fatalf("%s: Barging %v, %v; want %v", dsn, u != nil && u.Options.Barging, err, barging)
		}
	}

	u, err = ParseURL("rueidis://user:pw@h1:7000/3?prefix=app&dial_timeout=2s&client_name=x&tls=true&node_timeout=20ms&drift_factor=0.02&max_key_len=10&token_retention=1h", rueidisSpec)
	if err != nil {
		t.Fatal(err)
	}
	if u.Username != "user" || u.Password != "pw" || u.DB != 3 || len(u.Addrs) != 1 || u.Addrs[0] != "h1:7000" ||
		u.DialTimeout != 2*time.Second || u.ClientName != "x" || !u.TLS || u.Options.Prefix != "app" ||
		u.Options.NodeTimeout != 20*time.Millisecond || u.Options.DriftFactor != 0.02 || u.Options.MaxKeyLen != 10 ||
		u.Options.TokenRetention != time.Hour || u.Mode() != "single" {
		t.Fatalf("parsed %+v", u)
	}

	u, err = ParseURL("rueidis://h1,h2:7001,[::1]:7002,[::2]", rueidisSpec)
	if err != nil || strings.Join(u.Addrs, " ") != "h1:6379 h2:7001 [::1]:7002 [::2]:6379" || u.Mode() != "redlock" {
		t.Fatalf("hosts: %+v %v", u, err)
	}

	// Defaults.
	for _, dsn := range []string{"rueidis://", "rueidis://?", "rueidis://user:pw@/"} {
		u, err = ParseURL(dsn, rueidisSpec)
		if err != nil || len(u.Addrs) != 1 || u.Addrs[0] != "127.0.0.1:6379" || u.DB != 0 ||
			u.Options != (Options{}).WithDefaults() || u.DialTimeout != 5*time.Second || u.TLS || u.Mode() != "single" {
			t.Fatalf("%s: defaults: %+v %v", dsn, u, err)
		}
	}

	u, err = ParseURL("rueidis://s1,s2?sentinel_master=m&sentinel_password=p&sentinel_username=u", rueidisSpec)
	if err != nil || u.SentinelMaster != "m" || u.SentinelPassword != "p" || u.SentinelUsername != "u" || u.Mode() != "sentinel" {
		t.Fatalf("sentinel: %+v %v", u, err)
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
		u, err := ParseURL(dsn, redisSpec(&redisExtra{}))
		if err != nil {
			t.Errorf("%s: %v", dsn, err)
			continue
		}
		if u.Mode() != mode {
			t.Errorf("%s: mode %s, want %s", dsn, u.Mode(), mode)
		}
	}
	if u, err := ParseURL("rediss://h:1?insecure_skip_verify=true", redisSpec(&redisExtra{})); err != nil || !u.TLS || !u.InsecureTLS {
		t.Fatalf("rediss: %+v %v", u, err)
	}
	if u, err := ParseURL("rueidis://h:1?tls=true&insecure_skip_verify=true", rueidisSpec); err != nil || !u.TLS || !u.InsecureTLS {
		t.Fatalf("tls=true: %+v %v", u, err)
	}

	// A spec without hooks has no TLS and no parameters of its own.
	bare := URLSpec{Driver: "x", Schemes: []string{"x"}, WantSchemes: "x", TLSHint: "nothing"}
	if u, err := ParseURL("x://h", bare); err != nil || u.TLS || u.DialTimeout != 0 {
		t.Fatalf("bare: %+v %v", u, err)
	}
	if _, err := ParseURL("x://h?tls=true", bare); err == nil || !strings.Contains(err.Error(), "unknown query parameter(s) tls") {
		t.Fatalf("bare with tls: %v", err)
	}
}

func TestParseURLSharedErrors(t *testing.T) {
	for _, tc := range []struct{ dsn, want string }{
		// drivers/redis
		{"redis://h:1?bogus=1", "redis: unknown query parameter(s) bogus"},
		{"redis://h:1,h:2,h:3?fair=true", "redis: fair=true: Redlock does not queue waiters"},
		{"redis://h:1?b=1&a=2", "redis: unknown query parameter(s) a, b"},
		{"redis://h:1?cluster=true&sentinel_master=m", "redis: cluster=true and sentinel_master are mutually exclusive"},
		{"redis://h:1/1?cluster=true", "redis: a Redis Cluster has only database 0, not 1"},
		{"http://h:1", `redis: URL scheme "http": want redis or rediss`},
		{"rueidis://h:1", `redis: URL scheme "rueidis": want redis or rediss`},
		{"redis:opaque", "redis: malformed URL: want redis://host:port"},
		{"redis://h:99999", `redis: malformed port in host "h:99999"`},
		{"redis://h:0", `redis: malformed port in host "h:0"`},
		{"redis://:1", `redis: malformed host ":1"`},
		{"redis://h:1,,h:2", `redis: empty host in host list "h:1,,h:2"`},
		{"redis://h:1,h:1", `redis: host "h:1" listed twice`},
		{"redis://h,h:6379", `redis: host "h:6379" listed twice`},
		{"redis://h:1/x", `redis: path "/x": want a database number such as /0`},
		{"redis://h:1/-1", `redis: path "/-1": want a database number such as /0`},
		{"redis://h:1?cluster=maybe", `redis: cluster="maybe": want true or false`},
		{"redis://h:1?dial_timeout=0s", `redis: dial_timeout="0s": want a positive Go duration such as 5s`},
		{"redis://h:1?read_timeout=soon", `redis: read_timeout="soon": want a positive Go duration such as 5s`},
		{"redis://h:1?pool_size=-1", `redis: pool_size="-1": want a positive integer`},
		{"redis://h:1?pool_size=1&pool_size=2", `redis: query parameter "pool_size" given 2 times`},
		{"redis://h:1?sentinel_password=p", "redis: sentinel_username/sentinel_password need sentinel_master"},
		{"redis://h:1?sentinel_username=u", "redis: sentinel_username/sentinel_password need sentinel_master"},
		{"redis://h:1?sentinel_master=", "redis: sentinel_master must not be empty"},
		{"redis://h:1?allow_replica=true&cluster=true", "redis: allow_replica applies to single-node and Redlock URLs only"},
		{"redis://h:1?allow_replica=true&sentinel_master=m", "redis: allow_replica applies to single-node and Redlock URLs only"},
		{"redis://h:1?insecure_skip_verify=true", "redis: insecure_skip_verify needs the rediss scheme"},
		{"redis://h:1?prefix={x}", "redis: prefix"},
		{"redis://h:1?node_timeout=1&node_timeout=2", `redis: query parameter "node_timeout" given 2 times`},
		{"redis://:secret@h:1?max_key_len=x", "redis: max_key_len"},
		{"redis://:secret@h:1%zz", "redis: malformed port"},
		{"redis://:secret@h:1/%zz", "redis: malformed URL"},
		{"redis://h:1?a=%zz", "redis: malformed query"},
		// The shared parameters come first, then the driver's, then the
		// check for unknown ones, then the cross-checks.
		{"redis://h:1?cluster=x&pool_size=x", "redis: cluster="},
		{"redis://h:1?pool_size=x&bogus=1", "redis: pool_size="},
		{"redis://h:1?bogus=1&cluster=true&sentinel_master=m", "redis: unknown query parameter(s) bogus"},

		// drivers/rueidis
		{"redis://h1", `rueidis: URL scheme "redis": want "rueidis"`},
		{"rueidis://h1?bogus=1", "rueidis: unknown query parameter(s) bogus"},
		{"rueidis://h1?read_timeout=1s", "rueidis: unknown query parameter(s) read_timeout"},
		{"rueidis://h1?cluster=maybe", `rueidis: cluster="maybe": want true or false`},
		{"rueidis://h1?cluster=1&cluster=0", `rueidis: query parameter "cluster" given 2 times`},
		{"rueidis://h1?cluster=true&sentinel_master=m", "rueidis: cluster=true and sentinel_master are mutually exclusive"},
		{"rueidis://h1?sentinel_password=p", "rueidis: sentinel_username/sentinel_password need sentinel_master"},
		{"rueidis://h1/x", `rueidis: path "/x": want a database number such as /0`},
		{"rueidis://h1/1?cluster=true", "rueidis: a Redis Cluster has only database 0, not 1"},
		{"rueidis://h1:99999", `rueidis: malformed port in host "h1:99999"`},
		{"rueidis://h1,,h2", `rueidis: empty host in host list "h1,,h2"`},
		{"rueidis://h1?dial_timeout=-1s", `rueidis: dial_timeout="-1s": want a positive Go duration such as 5s`},
		{"rueidis://h1?dial_timeout=soon", `rueidis: dial_timeout="soon": want a positive Go duration such as 5s`},
		{"rueidis://h1?tls=yes", `rueidis: tls="yes": want true or false`},
		{"rueidis://h1?tls=x&insecure_skip_verify=x", `rueidis: tls="x"`},
		{"rueidis://h1?prefix=a{b}", "rueidis: redis: prefix"},
		{"rueidis://h1?node_timeout=0s", "rueidis: redis: node_timeout"},
		{"rueidis://h1?drift_factor=0.7", "rueidis: redis: drift_factor"},
		{"rueidis://h1?max_key_len=-1", "rueidis: redis: max_key_len"},
		{"rueidis://h1?client_name=", "rueidis: client_name must not be empty"},
		{"rueidis://h1?cluster=true&allow_replica=true", "rueidis: allow_replica applies to single-node and Redlock URLs only"},
		{"rueidis://:pw@h1:%zz", "rueidis: malformed port"},
		{"rueidis://:pw@h1/%zz", "rueidis: malformed URL"},
		{"rueidis:opaque", "rueidis: malformed URL: want rueidis://host:port"},
		{"rueidis://h1,h1", `rueidis: host "h1:6379" listed twice`},
		{"rueidis://h1?insecure_skip_verify=true", "rueidis: insecure_skip_verify needs tls=true"},
	} {
		spec := rueidisSpec
		if strings.HasPrefix(tc.want, "redis:") {
			spec = redisSpec(&redisExtra{})
		}
		u, err := ParseURL(tc.dsn, spec)
		if err == nil {
			t.Errorf("%s: %+v, want an error", tc.dsn, u)
			continue
		}
		if !errors.Is(err, driver.ErrInvalid) || !strings.HasPrefix(err.Error(), spec.Driver+": ") || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want ErrInvalid starting with %q", tc.dsn, err, tc.want)
		}
		if strings.Contains(err.Error(), "secret") || strings.Contains(err.Error(), "pw") {
			t.Errorf("%s: error leaks the password: %v", tc.dsn, err)
		}
	}
}

func TestSplitHosts(t *testing.T) {
	for _, tc := range []struct{ in, hosts, rest string }{
		{"redis://h1,h2:7001/0?x=1", "h1,h2:7001", "redis://hosts/0?x=1"},
		{"redis://u:p@w@[::1],h#f", "[::1],h", "redis://u:p@w@hosts#f"},
		{"redis://u:p@", "", "redis://u:p@"},
		{"redis://", "", "redis://"},
		{"redis:opaque", "", "redis:opaque"},
	} {
		hosts, rest := splitHosts(tc.in)
		if hosts != tc.hosts || rest != tc.rest {
			t.Errorf("splitHosts(%q) = %q, %q; want %q, %q", tc.in, hosts, rest, tc.hosts, tc.rest)
		}
	}
}

func TestQuery(t *testing.T) {
	v, _ := url.ParseQuery("b=true&s=x&d=2s&n=3&twice=1&twice=2&empty=&bad=x&other=1")
	q := &Query{Driver: "drv", Values: v}
	var (
		b bool
		s string
		d time.Duration
		n int
	)
	if err := q.Bool("b", &b); err != nil || !b {
		t.Fatalf("Bool: %v %v", b, err)
	}
	if err := q.String("s", &s); err != nil || s != "x" {
		t.Fatalf("String: %q %v", s, err)
	}
	if err := q.Duration("d", &d); err != nil || d != 2*time.Second {
		t.Fatalf("Duration: %v %v", d, err)
	}
	if err := q.PositiveInt("n", &n); err != nil || n != 3 {
		t.Fatalf("PositiveInt: %v %v", n, err)
	}
	// Absent parameters leave dst alone.
	if err := q.Bool("absent", &b); err != nil || !b {
		t.Fatalf("absent Bool: %v %v", b, err)
	}
	if err := q.Duration("absent", &d); err != nil || d != 2*time.Second {
		t.Fatalf("absent Duration: %v %v", d, err)
	}
	for name, read := range map[string]func() error{
		`drv: query parameter "twice" given 2 times`: func() error { return q.String("twice", &s) },
		"drv: empty must not be empty":               func() error { return q.String("empty", &s) },
		`drv: bad="x": want a positive integer`:      func() error { return q.PositiveInt("bad", &n) },
	} {
		if err := read(); !errors.Is(err, driver.ErrInvalid) || !strings.HasPrefix(err.Error(), name) {
			t.Errorf("%v, want ErrInvalid starting with %q", err, name)
		}
	}
	if len(v) != 1 || v.Get("other") != "1" {
		t.Fatalf("left over %v, want only other", v)
	}
	if err := Invalid("drv", "x %d", 1); !errors.Is(err, driver.ErrInvalid) || err.Error() != "drv: x 1: "+driver.ErrInvalid.Error() {
		t.Fatalf("Invalid: %v", err)
	}
}
