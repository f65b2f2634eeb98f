package redistest

import (
	"os"
	"testing"
)

// Signal sends sig to the process: SIGSTOP freezes it, as a hung node would
// be, and SIGCONT thaws it.
func (p *Process) Signal(sig os.Signal) error { return p.p.cmd.Process.Signal(sig) }

// NeedRedisServer ends t unless there is a server binary to start: it
// skips t when redis-server is not on PATH (and EnvServer is unset), or
// fails it when EnvRequire is set or EnvServer names no server binary
// (ServerBinary). For tests that start processes with StartProcess.
func NeedRedisServer(t testing.TB) {
	t.Helper()
	ServerBinary(t)
}
