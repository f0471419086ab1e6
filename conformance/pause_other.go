//go:build !unix

package conformance

import "os"

// sigStop and sigCont are nil where there is no SIGSTOP: Faults/Pause then
// fails with an error saying so.
var sigStop, sigCont os.Signal
