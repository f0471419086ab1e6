package rueidis

import (
	"errors"
	"strings"
	"testing"

	"github.com/go-locker/locker/driver"
	"github.com/go-locker/locker/internal/rediscore"
	"github.com/go-locker/locker/internal/redistest"
)

// evictingURLs starts one deployment of each mode with one server whose
// maxmemory-policy is allkeys-lru and returns their URLs by mode.
func evictingURLs(t *testing.T) map[string]string {
	evict := func(s *redistest.Server) {
		if _, err := s.Do("CONFIG", "SET", "maxmemory-policy", "allkeys-lru"); err != nil {
			t.Fatal(err)
		}
	}
	single := redistest.Start(t, "--maxmemory-policy", "allkeys-lru")
	// CONFIG renamed away, as managed services do: the policy is read
	// from INFO memory.
	noConfig := redistest.Start(t, "--maxmemory-policy", "volatile-ttl", "--rename-command", "CONFIG", "")
	rl := redistest.StartN(t, 3)
	evict(rl[1])
	c := redistest.StartCluster(t, 3)
	evict(c.Masters[2])
	sn := redistest.StartSentinel(t)
	evict(sn.Master)
	return map[string]string{
		"single":    urlOf(single.Addr),
		"no-config": urlOf(noConfig.Addr),
		"redlock":   urlOf(redistest.Addrs(rl)...),
		"cluster":   urlOf(c.Addrs()...) + "?cluster=true",
		"sentinel":  urlOf(sn.Sentinel.Addr) + "?sentinel_master=" + sn.Name,
	}
}

// A server whose maxmemory-policy can evict lock keys is refused at Open in
// every mode, with an error naming the policy and allow_eviction; with
// allow_eviction=true it is accepted.
func TestOpenRefusesEvictingServer(t *testing.T) {
	for mode, u := range evictingURLs(t) {
		t.Run(mode, func(t *testing.T) {
			l, err := Open(u)
			if err == nil {
				l.Close()
				t.Fatal("Open accepted a server with an evicting maxmemory-policy")
			}
			want := "allkeys-lru"
			if mode == "no-config" {
				want = "volatile-ttl"
			}
			if !errors.Is(err, rediscore.ErrEvictionPolicy) || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "allow_eviction=true") {
				t.Fatalf("Open = %v; want an error naming %s and allow_eviction=true", err, want)
			}
			l, err = Open(withParams(u, "allow_eviction=true"))
			if err != nil {
				t.Fatalf("Open with allow_eviction=true: %v", err)
			}
			l.Close()
		})
	}
}

func TestAllowEvictionBadValue(t *testing.T) {
	if _, err := Open("rueidis://127.0.0.1:1?allow_eviction=maybe"); !errors.Is(err, driver.ErrInvalid) || !strings.Contains(err.Error(), "allow_eviction") {
		t.Fatalf("Open with allow_eviction=maybe = %v, want ErrInvalid naming the parameter", err)
	}
}

func withParams(dsn string, params ...string) string {
	for _, p := range params {
		if strings.Contains(dsn, "?") {
			dsn += "&" + p
		} else {
			dsn += "?" + p
		}
	}
	return dsn
}
