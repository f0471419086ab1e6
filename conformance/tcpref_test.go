package conformance_test

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/go-locker/locker/conformance"
	"github.com/go-locker/locker/driver"
)

// tcpAddrEnv carries the server's address to the child process of
// Faults/Pause, which reaches the parent's server instead of starting one.
const tcpAddrEnv = "LOCKER_TCPREF_ADDR"

// tcpVariant runs a flaw on the TCP reference driver (TestSuiteCatchesBrokenDrivers).
const tcpVariant = "tcp"

// TestTCPReference runs the whole conformance suite, every fault subtest
// included, on the TCP reference driver.
func TestTCPReference(t *testing.T) {
	conformance.Run(t, tcpHarness(t, "none"))
}

// emptyRestartGap is how much later than another owner's grant a holder
// may hear that a restart without data ended its lease: the server has
// forgotten the lease, so nothing stops another owner from taking the key
// as soon as it reconnects, while the holder hears when its own re-dial
// (5ms, 15ms, 35ms, 75ms … after the break, against a 50ms downtime)
// re-checks its watched grants. Both reconnect on the same schedule, so the
// gap is a few milliseconds; the bound leaves room for a loaded machine.
const emptyRestartGap = 250 * time.Millisecond

// tcpHarness is the harness of the TCP reference driver, with every fault
// hook wired:
//
//   - Open, Cut and Reset come from conformance.NewProxied: each Locker
//     dials the server through a fault proxy of its own, which Cut
//     blackholes and Reset resets;
//   - Restart and RestartEmpty stop the in-process server (every
//     connection ends) and start it again on the same port, with or
//     without its leases;
//   - Pause runs a holder in a child process: ChildEnv gives it the
//     server's address, and there the harness dials it instead of starting
//     a server.
//
// flaw names the flaw planted in the driver and its server ("none" for
// the correct driver).
func tcpHarness(t *testing.T, flaw string) conformance.Harness {
	is := func(name string) bool { return name == flaw }
	if addr := os.Getenv(tcpAddrEnv); addr != "" { // Faults/Pause's child
		return conformance.Harness{Open: func(context.Context) (driver.Locker, error) { return openTCP(addr, is), nil }}
	}
	srv, err := startTCPServer(is)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	px := conformance.NewProxied([]string{srv.addr}, func(_ context.Context, addrs []string) (driver.Locker, error) {
		return openTCP(addrs[0], is), nil
	})
	t.Cleanup(func() { _ = px.Close() })
	return conformance.Harness{
		Open:         px.Open,
		Cut:          px.Cut,
		Reset:        px.Reset,
		Restart:      func(ctx context.Context) error { return srv.Restart(ctx, false) },
		RestartEmpty: func(ctx context.Context) error { return srv.Restart(ctx, true) },
		Pause:        true,
		ChildEnv:     []string{tcpAddrEnv + "=" + srv.addr},
		LostBound:    map[string]time.Duration{"RestartEmpty": emptyRestartGap},
	}
}
