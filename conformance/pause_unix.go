//go:build unix

package conformance

import (
	"os"
	"syscall"
)

// sigStop and sigCont pause and resume Faults/Pause's child.
var sigStop, sigCont os.Signal = syscall.SIGSTOP, syscall.SIGCONT
