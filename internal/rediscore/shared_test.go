package rediscore

import (
	"strings"
	"testing"

	"github.com/go-locker/locker/driver"
	"github.com/go-locker/locker/internal/opaquetest"
)

// TestSharedKeys: the keys of a key's semaphore, of its read-write lock and
// of its mutex are all distinct, across every key of keyCases and
// opaquetest.Names, and all carry the hash tag of the mutex's lock key (one
// Cluster slot; the Cluster conformance runs show no CROSSSLOT).
func TestSharedKeys(t *testing.T) {
	seen := map[string]string{}
	for _, k := range append(append([]string{}, keyCases...), opaquetest.Names...) {
		lock, counter, _ := Keys("", k)
		q, qt := QueueKeys(lock)
		sem := SharedKeys("", k, driver.SharedPermit)
		rw := SharedKeys("", k, driver.SharedRead)
		if w := SharedKeys("", k, driver.SharedWrite); strings.Join(w, "\x00") != strings.Join(rw, "\x00") {
			t.Fatalf("%q: read and write keys differ: %q, %q", k, rw, w)
		}
		if sem[2] != counter || rw[2] != counter {
			t.Fatalf("%q: the shared counter is not the mutex's", k)
		}
		tag := lock[strings.IndexByte(lock, '{') : strings.IndexByte(lock, '}')+1]
		names := append([]string{lock, counter, q, qt}, sem[:2]...)
		names = append(names, sem[3:]...)
		names = append(names, rw[:2]...)
		names = append(names, rw[3:]...)
		for _, name := range names {
			if !strings.HasPrefix(name, "locker:"+tag) {
				t.Errorf("%q: %q is not under the hash tag %s", k, name, tag)
			}
		}
		for _, name := range names {
			if prev, ok := seen[name]; ok {
				t.Fatalf("%q and %q share the name %q", prev, k, name)
			}
			seen[name] = k
		}
	}
}
