package driver_test

import (
	"os/exec"
	"strings"
	"testing"
)

// Package driver depends on the standard library only, and so does the
// fault proxy that test suites of other modules may import.
func TestStandardLibraryOnly(t *testing.T) {
	for _, pkg := range []string{"github.com/go-locker/locker/driver", "github.com/go-locker/locker/conformance/faultproxy"} {
		out, err := exec.Command("go", "list", "-deps", "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}", pkg).CombinedOutput()
		if err != nil {
			t.Fatalf("go list: %v\n%s", err, out)
		}
		for _, d := range strings.Fields(string(out)) {
			if d != pkg {
				t.Errorf("%s imports %s, outside the standard library", pkg, d)
			}
		}
	}
}
