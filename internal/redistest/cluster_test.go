package redistest

import (
	"strings"
	"testing"
)

func TestCluster(t *testing.T) {
	c := StartCluster(t, 3)
	if len(c.Addrs()) != 3 {
		t.Fatal(c.Addrs())
	}
	// A key on a slot served elsewhere is redirected.
	moved := 0
	for _, k := range []string{"a", "b", "c", "d", "e", "f"} {
		if _, err := c.Masters[0].Do("SET", k, "1"); err != nil && strings.HasPrefix(err.Error(), "MOVED") {
			moved++
		}
	}
	if moved == 0 {
		t.Fatal("no MOVED: slots are not spread")
	}
}

func TestSentinel(t *testing.T) {
	sn := StartSentinel(t)
	v, err := sn.Sentinel.Do("SENTINEL", "get-master-addr-by-name", sn.Name)
	if err != nil {
		t.Fatal(err)
	}
	if a, _ := v.([]any); len(a) != 2 || a[1] != strings.TrimPrefix(sn.Master.Addr, "127.0.0.1:") {
		t.Fatalf("master addr = %v, want %s", v, sn.Master.Addr)
	}
}
