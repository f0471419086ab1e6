package rediscore

import (
	"context"
	"errors"
	"fmt"
	"strings"
)

// ErrEvictionPolicy marks a server refused because its maxmemory-policy can
// evict lock keys (see CheckEviction).
var ErrEvictionPolicy = errors.New("maxmemory-policy can evict lock keys")

// DoFunc runs one command on one server and returns its reply as Conn.Run
// converts replies; a map reply may also come as a Go map or as an array of
// alternating keys and values.
type DoFunc func(ctx context.Context, args ...string) (any, error)

// EvictionPolicy returns the server's maxmemory-policy, from CONFIG GET
// maxmemory-policy or, when CONFIG is disabled or renamed (as managed Redis
// services do) or its reply is unusable, from the maxmemory_policy line of
// INFO memory. It fails only when neither answers; the error names both
// causes and wraps the INFO call's error.
func EvictionPolicy(ctx context.Context, do DoFunc) (string, error) {
	v, cerr := do(ctx, "CONFIG", "GET", "maxmemory-policy")
	if cerr == nil {
		if p := configValue(v, "maxmemory-policy"); p != "" {
			return p, nil
		}
		cerr = fmt.Errorf("unexpected reply %v", v)
	}
	v, ierr := do(ctx, "INFO", "memory")
	if ierr == nil {
		s, _ := v.(string)
		for _, line := range strings.Split(s, "\n") {
			if p, ok := strings.CutPrefix(strings.TrimSpace(line), "maxmemory_policy:"); ok && p != "" {
				return p, nil
			}
		}
		ierr = errors.New("no maxmemory_policy line in the reply")
	}
	return "", fmt.Errorf("cannot read maxmemory-policy (CONFIG GET: %v; INFO memory: %w)", cerr, ierr)
}

// configValue returns the value of name in a CONFIG GET reply, or "".
func configValue(v any, name string) string {
	switch x := v.(type) {
	case []any:
		for i := 0; i+1 < len(x); i += 2 {
			if k, _ := x[i].(string); strings.EqualFold(k, name) {
				s, _ := x[i+1].(string)
				return s
			}
		}
	case map[any]any:
		s, _ := x[name].(string)
		return s
	case map[string]any:
		s, _ := x[name].(string)
		return s
	case map[string]string:
		return x[name]
	}
	return ""
}

// CheckEviction refuses a server whose maxmemory-policy can evict lock keys:
// every policy but noeviction can (lock keys always carry a TTL, so the
// volatile-* policies evict them too). An evicted lock vanishes and another
// owner can take it while the holder still believes it holds it. With
// allow true it makes no round trip and returns nil. The error starts with
// drv and addr, names the policy and the allow_eviction URL parameter, and
// wraps ErrEvictionPolicy; a policy it cannot read is refused too (the
// error names both attempts and says allow_eviction=true skips the check).
func CheckEviction(ctx context.Context, drv, addr string, allow bool, do DoFunc) error {
	if allow {
		return nil
	}
	p, err := EvictionPolicy(ctx, do)
	if err != nil {
		return fmt.Errorf("%s: %s: %w; allow_eviction=true skips this check", drv, addr, err)
	}
	if p == "noeviction" {
		return nil
	}
	return fmt.Errorf("%s: %s: maxmemory-policy is %s: %w under memory pressure, and another owner could then take a lock its holder still believes it holds; set maxmemory-policy noeviction on the server, or add allow_eviction=true to the URL to accept the risk",
		drv, addr, p, ErrEvictionPolicy)
}
