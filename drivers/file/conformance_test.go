package file

import (
	"context"
	"os"
	"testing"

	"github.com/go-locker/locker/conformance"
	"github.com/go-locker/locker/driver"
)

// dirEnv carries the directory to the child process of Faults/Pause.
const dirEnv = "LOCKER_FILE_CONFORMANCE_DIR"

// TestConformance runs the suite on one directory; every Open is a separate
// Locker, as separate processes on the host would have. Faults/Pause holds
// a lock from a child process on the same directory and stops it with
// SIGSTOP; the file driver has no server to cut, reset or restart.
func TestConformance(t *testing.T) {
	dir := os.Getenv(dirEnv)
	if dir == "" {
		dir = t.TempDir()
	}
	conformance.Run(t, conformance.Harness{
		Open:     func(context.Context) (driver.Locker, error) { return Open(context.Background(), "file://"+dir) },
		Pause:    true,
		ChildEnv: []string{dirEnv + "=" + dir},
	})
}
