package rediscore

import "testing"

// TestParseWake: a wake-up is the lock key alone and a nudge is
// "{<ms>}<lock>", whatever bytes the lock key holds (spaces, colons,
// braces, newlines, non-UTF-8, digits after a space: what the old
// "<lock> <ms>" form split wrongly); "" and a malformed nudge wake every
// waiter (lock "").
func TestParseWake(t *testing.T) {
	for _, key := range []string{"k", "tenant 42/report", "a 5", "x:{y}", "{5}x 7", "line\nbreak", "\xff\xfe 1"} {
		for _, prefix := range []string{"", "my app", "p:q 7"} {
			lock, _, _ := Keys(prefix, key)
			if got, ms, nudged := parseWake(lock); got != lock || nudged || ms != 0 {
				t.Errorf("parseWake(%q) = %q, %d, %v; want the lock, not a nudge", lock, got, ms, nudged)
			}
			if got, ms, nudged := parseWake("{250}" + lock); got != lock || !nudged || ms != 250 {
				t.Errorf("parseWake(nudge of %q) = %q, %d, %v; want the lock, 250ms", lock, got, ms, nudged)
			}
		}
	}
	for _, bad := range []string{"", "{", "{}x", "{-1}x", "{12", "{1x}y", "{5}"} {
		if got, _, nudged := parseWake(bad); got != "" || nudged {
			t.Errorf("parseWake(%q) = %q, %v; want \"\" (wake every waiter)", bad, got, nudged)
		}
	}
}
