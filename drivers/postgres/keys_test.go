package postgres

import (
	"strings"
	"testing"
)

func TestAdvisoryKeyStable(t *testing.T) {
	// Golden values: the mapping is part of the documented format and must
	// never change.
	for _, c := range []struct {
		ns, key string
		want    int64
	}{
		{"locker", "a", 481282655955929587},
		{"locker", "orders/42", 6513664954601717373},
		{"app", "", 5913765817644200321},
	} {
		if got := AdvisoryKey(c.ns, c.key); got != c.want {
			t.Errorf("AdvisoryKey(%q, %q) = %d, want %d", c.ns, c.key, got, c.want)
		}
	}
	if AdvisoryKey("locker", "a") == AdvisoryKey("other", "a") {
		t.Error("namespace does not change the key")
	}
	// The separator keeps ("ab","c") and ("a","bc") apart.
	if AdvisoryKey("ab", "c") == AdvisoryKey("a", "bc") {
		t.Error("namespace/key boundary is ambiguous")
	}
	seen := map[int64]string{}
	for i := range 100000 {
		k := "key/" + strings.Repeat("x", i%7) + string(rune('a'+i%26)) + itoa(i)
		a := AdvisoryKey("locker", k)
		if prev, dup := seen[a]; dup {
			t.Fatalf("%q and %q collide", prev, k)
		}
		seen[a] = k
	}
}

func itoa(i int) string {
	var b [20]byte
	n := len(b)
	for {
		n--
		b[n] = byte('0' + i%10)
		i /= 10
		if i == 0 {
			return string(b[n:])
		}
	}
}

func TestAppName(t *testing.T) {
	for _, owner := range []string{"0123456789abcdef0123456789abcdef", "x", strings.Repeat("o", maxOwnerTag)} {
		name := appName(1<<63+5, 2147483647, ownerTag(owner))
		if len(name) > 63 {
			t.Fatalf("application_name %q is %d bytes", name, len(name))
		}
		tok, ttl, tag, ok := parseAppName(name)
		if !ok || tok != 1<<63+5 || ttl != 2147483647 || tag != owner {
			t.Fatalf("parseAppName(%q) = %d %d %q %v", name, tok, ttl, tag, ok)
		}
	}
	for _, owner := range []string{strings.Repeat("o", maxOwnerTag+1), "ünï", "a\nb"} {
		tag := ownerTag(owner)
		if !strings.HasPrefix(tag, "#") || len(tag) != maxOwnerTag || !printable(tag) {
			t.Fatalf("ownerTag(%q) = %q", owner, tag)
		}
	}
	for _, bad := range []string{"", "psql", "lk/", "lk/zz/1/o", "lk/1/zz/o", "lk/1/1"} {
		if _, _, _, ok := parseAppName(bad); ok {
			t.Errorf("parseAppName(%q) accepted", bad)
		}
	}
}
