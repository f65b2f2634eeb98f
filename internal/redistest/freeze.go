package redistest

import (
	"os"
	"testing"
)

// Signal sends sig to the process: SIGSTOP freezes it, as a hung node would
// be, and SIGCONT thaws it.
func (p *Process) Signal(sig os.Signal) error { return p.p.cmd.Process.Signal(sig) }

// NeedRedisServer skips t when redis-server is not on PATH, or fails it
// when EnvRequire is set: for tests that start processes with StartProcess.
func NeedRedisServer(t testing.TB) {
	t.Helper()
	if haveBinary("redis-server") {
		return
	}
	if required() {
		t.Fatalf("redistest: %s=1 but redis-server is not on PATH", EnvRequire)
	}
	t.Skip("redistest: no redis-server on PATH: skipping a test that starts redis-server processes of its own")
}
