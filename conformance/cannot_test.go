package conformance_test

import (
	"context"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/go-locker/locker/conformance"
	"github.com/go-locker/locker/driver"
)

const cannotEnv = "LOCKER_CONFORMANCE_CANNOT"

// TestHarnessCannot: a subtest the Harness declares it cannot meet is
// logged with its reason and not run (the driver breaks it, and the run
// passes), and a declaration that names no subtest fails the run.
func TestHarnessCannot(t *testing.T) {
	if name := os.Getenv(cannotEnv); name != "" {
		st := newFlawStore("election-inspect-stale")
		conformance.Run(t, conformance.Harness{
			Open: func(context.Context) (driver.Locker, error) {
				return &flawedElection{flawedBlocking: flawedBlocking{&flawed{st: st}}, stale: map[string]staleInfo{}}, nil
			},
			Cannot: map[string]string{name: "a stale cache in front of Inspect"},
		})
		return
	}
	for _, c := range []struct {
		name    string
		wantErr bool
		want    string
	}{
		{"Locker/ElectionObserve", false, "conformance: Locker/ElectionObserve is not run: the Harness declares the backend cannot meet it: a stale cache in front of Inspect"},
		{"Locker/NoSuchSubtest", true, `conformance: Harness.Cannot names "Locker/NoSuchSubtest", which is not a subtest of this driver's run`},
	} {
		t.Run(strings.ReplaceAll(c.name, "/", "_"), func(t *testing.T) {
			cmd := exec.Command(os.Args[0], "-test.run=^TestHarnessCannot$/^Locker$/^ElectionObserve$", "-test.v", "-test.count=1", "-test.timeout=2m")
			cmd.Env = append(os.Environ(), cannotEnv+"="+c.name)
			out, err := cmd.CombinedOutput()
			if (err != nil) != c.wantErr || !strings.Contains(string(out), c.want) {
				t.Fatalf("Cannot %q: err %v, want failure %v and %q in:\n%s", c.name, err, c.wantErr, c.want, out)
			}
			if !c.wantErr && strings.Contains(string(out), "=== RUN   TestHarnessCannot/Locker/ElectionObserve") {
				t.Fatalf("the declared subtest ran:\n%s", out)
			}
		})
	}
}
