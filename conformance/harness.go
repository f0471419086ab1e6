package conformance

import (
	"context"
	"time"

	"github.com/go-locker/locker/driver"
)

// Harness tells Run how to reach the backend under test, and which faults
// the driver's test can stage there.
type Harness struct {
	// Open returns a fresh driver.Locker on the backend under test. Each
	// call stands for a separate process: the suite opens several and makes
	// them contend. It is called from several goroutines at once (subtests
	// run side by side). Run closes every Locker it opens. Required.
	Open func(ctx context.Context) (driver.Locker, error)
	// MinTTL is the shortest TTL the backend honours; the suite scales its
	// timings to it (its unit TTL is MinTTL, at least 100ms). Zero means
	// 100ms.
	MinTTL time.Duration

	// The fault hooks below are optional. For each one set, Run runs the
	// fault subtest of the same name ("Faults/Cut", …; see the package
	// documentation, "Fault subtests"), and the directed fault subtests
	// that need it ("Faults/LostReply", …; "Directed fault subtests"); for
	// each one unset, those subtests are not registered. The fault subtests
	// run one at a time, after every other subtest, since a fault may touch
	// the whole server. A hook that returns an error fails its subtest with
	// that error.

	// Cut cuts d, a Locker that Open returned, off from the server until
	// heal is called: d's requests hang or time out, while the server keeps
	// its state and every other Locker still reaches it (a partition, or a
	// holder whose network stalls). The suite calls heal exactly once.
	Cut func(d driver.Locker) (heal func(), err error)
	// Reset breaks every connection d has to the server, as a TCP reset
	// does: d's calls in flight fail, and d may reconnect. The server keeps
	// its state, unless the backend ties locks to connections.
	Reset func(d driver.Locker) error
	// Restart stops the server and starts it again with its data (a restart
	// with persistence, or a failover that kept every write). It returns
	// once the server accepts connections again.
	Restart func(ctx context.Context) error
	// RestartEmpty stops the server and starts it again with none of its
	// data (no persistence, a failover to a replica that missed writes).
	// Tokens must still increase across it, unless the driver's
	// Capabilities.DurableTokens is false.
	RestartEmpty func(ctx context.Context) error
	// Pause runs Faults/Pause: the suite starts a copy of the test binary
	// as a child process, running only the test that called Run; there Run
	// opens a Locker with Open, holds a lock, and reports what it sees; the
	// suite stops the child with SIGSTOP past the lock's TTL, then resumes
	// it. The child's Open must reach the same backend as the parent's:
	// the child's environment is the parent's plus ChildEnv, which the
	// test can read to find the server it started. Unix only.
	Pause bool
	// ChildEnv is added to the environment of Pause's child process, as
	// "NAME=value" entries.
	ChildEnv []string
	// LostBound says, per fault subtest name ("Cut", "Reset", "Restart",
	// "RestartEmpty", "Pause"), how much later than another owner's grant
	// a holder's Lost may close under that fault: the gap the backend
	// documents (for example, PostgreSQL advisory locks end with their
	// session, and the holder hears a few milliseconds after a waiter may
	// have been granted). Absent means zero: Lost must close first.
	LostBound map[string]time.Duration
	// Cannot declares the subtests the backend cannot meet, by name
	// ("Locker/ElectionObserve", "Faults/Reset"), each with the reason: a
	// known defect of the backend or the driver, documented where its users
	// will see it. Run logs each one with its reason and does not run it.
	// Leave it empty unless a subtest fails for a reason that cannot be
	// fixed yet; a name that is no subtest makes Run fail.
	Cannot map[string]string
}

// hasFaults reports whether any fault hook is set.
func (h Harness) hasFaults() bool {
	return h.Cut != nil || h.Reset != nil || h.Restart != nil || h.RestartEmpty != nil || h.Pause
}
