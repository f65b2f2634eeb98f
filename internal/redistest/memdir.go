package redistest

import (
	"os"
	"testing"
)

// memDirParent is where memTempDir makes its directories: a tmpfs on Linux.
const memDirParent = "/dev/shm"

// memTempDir makes a new directory, as os.MkdirTemp does, in memory
// (memDirParent) where the system has it, else in the default temporary
// directory. Servers that fsync on their main thread keep their files
// there: a cluster node fsyncs nodes.conf (and its directory) on every
// change of its slot map, thousands of times in one rebalance, and a
// sentinel its configuration on every failover. On a test machine whose
// disk is shared and busy one such fsync can stall the node for longer
// than a storage timeout, which a test of the store cannot tell from a
// defect; the fsync's cost is production's, not the store's.
func memTempDir(pattern string) (string, error) {
	if dir, err := os.MkdirTemp(memDirParent, pattern); err == nil {
		return dir, nil
	}
	return os.MkdirTemp("", pattern)
}

// MemDir returns a new directory for t's servers' files, in memory where
// the system has a tmpfs (see memTempDir), and removes it when t ends,
// after the cleanups registered after this call (the servers' kills). A
// test that starts cluster nodes or sentinels itself gives them one.
func MemDir(t testing.TB) string {
	t.Helper()
	dir, err := memTempDir("redistest-")
	if err != nil {
		t.Fatalf("redistest: %v", err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	return dir
}
