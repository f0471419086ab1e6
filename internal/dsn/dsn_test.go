package dsn

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/go-locker/locker/driver"
)

// wantInvalid checks that err wraps driver.ErrInvalid, starts with "x: "
// and contains want, and never the secret.
func wantInvalid(t *testing.T, what string, err error, want string) {
	t.Helper()
	switch {
	case !errors.Is(err, driver.ErrInvalid):
		t.Errorf("%s: %v, want ErrInvalid", what, err)
	case !strings.HasPrefix(err.Error(), "x: ") || !strings.Contains(err.Error(), want):
		t.Errorf("%s: %q, want \"x: …%s…\"", what, err, want)
	case strings.Contains(err.Error(), "s3cret"):
		t.Errorf("%s: %q leaks the password", what, err)
	}
}

func TestParse(t *testing.T) {
	u, err := Parse("x", "X://u:s3cret@h:1/p?a=1", "x", "x", "y")
	if err != nil || u.Scheme != "x" || u.Host != "h:1" || u.Path != "/p" {
		t.Fatalf("Parse: %+v, %v", u, err)
	}
	for raw, want := range map[string]string{
		"x://u:s3cret@h:1/%zz":  "malformed URL",
		"x://u:s3cret@h:1/\x7f": "malformed URL",
		"z://h":                 `URL scheme "z", want x`,
		"x://h#f":               "fragment",
		"%zz":                   "malformed URL",
	} {
		_, err := Parse("x", raw, "x", "x")
		wantInvalid(t, raw, err, want)
	}
}

func TestHostPorts(t *testing.T) {
	hs, err := HostPorts("x", "a:1,[::1]:2,b", "9")
	if err != nil || strings.Join(hs, " ") != "a:1 [::1]:2 b:9" {
		t.Fatalf("HostPorts: %q, %v", hs, err)
	}
	for list, want := range map[string]string{
		"":        "no host",
		"a:1,":    "empty host",
		"a":       "want host:port",
		":1":      "malformed host",
		"a:0":     "port",
		"a:65536": "port",
		"a:p":     "port",
		"a:1,a:1": "listed twice",
	} {
		_, err := HostPorts("x", list, "")
		wantInvalid(t, "HostPorts("+list+")", err, want)
	}
}

func TestQuery(t *testing.T) {
	u, err := Parse("x", "x://h?d=5s&z=0s&b=true&n=7&s=v&e=&pw=s3cret", "x", "x")
	if err != nil {
		t.Fatal(err)
	}
	q, err := NewQuery("x", u)
	if err != nil {
		t.Fatal(err)
	}
	var (
		d, z, unset = time.Second, time.Second, time.Minute
		b           bool
		n           = 1
		s, pw       string
	)
	for _, err := range []error{
		q.Duration("d", &d, Positive, 0),
		q.Duration("z", &z, 0, 0),
		q.Duration("unset", &unset, Positive, 0),
		q.Bool("b", &b),
		q.Int("n", &n, 1, 10),
		q.String("s", &s),
		q.String("pw", &pw),
	} {
		if err != nil {
			t.Fatal(err)
		}
	}
	if d != 5*time.Second || z != 0 || unset != time.Minute || !b || n != 7 || s != "v" || pw != "s3cret" {
		t.Fatalf("values: %v %v %v %v %v %q %q", d, z, unset, b, n, s, pw)
	}
	var e string
	wantInvalid(t, "empty String", q.String("e", &e), "query parameter e is empty")
	if err := q.Done(); err != nil {
		t.Fatalf("Done after reading everything: %v", err)
	}
}

func TestQueryInvalid(t *testing.T) {
	var (
		d time.Duration
		b bool
		n int
		s string
	)
	for query, tc := range map[string]struct {
		read func(q *Query) error
		want string
	}{
		"d=0s":         {func(q *Query) error { return q.Duration("d", &d, Positive, 0) }, `d="0s": want a positive duration such as 5s`},
		"d=-1s":        {func(q *Query) error { return q.Duration("d", &d, 0, 0) }, "want a duration ≥ 0s"},
		"d=2m":         {func(q *Query) error { return q.Duration("d", &d, time.Second, time.Minute) }, "want a duration from 1s to 1m0s"},
		"d=abc":        {func(q *Query) error { return q.Duration("d", &d, Positive, 0) }, `d="abc"`},
		"b=maybe":      {func(q *Query) error { return q.Bool("b", &b) }, `b="maybe": want true or false`},
		"n=11":         {func(q *Query) error { return q.Int("n", &n, 1, 10) }, "want an integer from 1 to 10"},
		"n=x":          {func(q *Query) error { return q.Int("n", &n, 1, 10) }, `n="x"`},
		"pw=1&pw=2":    {func(q *Query) error { return q.String("pw", &s) }, `query parameter "pw" given 2 times`},
		"pw=s3cret&zz": {func(q *Query) error { _ = q.String("pw", &s); return q.Done() }, `unknown query parameter "zz" (known: pw)`},
		"b=1&a=s3cret": {func(q *Query) error { _ = q.Bool("b", &b); return q.Done() }, `unknown query parameter "a" (known: b)`},
		"k=1":          {func(q *Query) error { return q.Done() }, `unknown query parameter "k" (x takes none)`},
	} {
		u, err := Parse("x", "x://h?"+query, "x", "x")
		if err != nil {
			t.Fatal(err)
		}
		q, err := NewQuery("x", u)
		if err != nil {
			t.Fatal(err)
		}
		wantInvalid(t, query, tc.read(q), tc.want)
	}
	u, _ := Parse("x", "x://h?%zz", "x", "x")
	_, err := NewQuery("x", u)
	wantInvalid(t, "bad escape", err, "malformed query")
}
