// Package pgtest is what the tests of idempg add to pgtemp: a missing
// PostgreSQL (or PgBouncer) skips a test, unless
// IDEMPOTENCY_TEST_REQUIRE_POSTGRES=1 makes it fail, and Run checks a
// package for leaked goroutines after its server stopped.
package pgtest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"testing"

	"go.uber.org/goleak"

	"github.com/idemkit/idempotency/idempg/pgtemp"
)

// RequireEnv is the environment variable that, set to 1, turns a missing
// PostgreSQL into a test failure instead of a skip.
const RequireEnv = "IDEMPOTENCY_TEST_REQUIRE_POSTGRES"

// Server is a throwaway PostgreSQL server (pgtemp.Server).
type Server = pgtemp.Server

// PgBouncer is a PgBouncer in front of a Server (pgtemp.PgBouncer).
type PgBouncer = pgtemp.PgBouncer

// The errors of a missing binary.
var (
	ErrNotFound    = pgtemp.ErrNotFound
	ErrNoPgBouncer = pgtemp.ErrNoPgBouncer
)

// Start starts a throwaway server (pgtemp.Start).
func Start() (*Server, error) { return pgtemp.Start() }

// CreateDatabase creates a database on the server at dsn
// (pgtemp.CreateDatabase).
func CreateDatabase(ctx context.Context, dsn, name string) error {
	return pgtemp.CreateDatabase(ctx, dsn, name)
}

// Required reports whether RequireEnv is set to 1.
func Required() bool { return os.Getenv(RequireEnv) == "1" }

// Skip ends a test that needs a server that could not be started: it skips
// when err matches ErrNotFound and RequireEnv is not set, and fails
// otherwise.
func Skip(t testing.TB, err error) {
	t.Helper()
	if errors.Is(err, ErrNotFound) && !Required() {
		t.Skipf("%v (set %s=1 to fail instead)", err, RequireEnv)
	}
	t.Fatalf("no PostgreSQL server: %v", err)
}

// SkipPgBouncer ends a test that needs a bouncer that could not be started:
// it skips when err matches ErrNoPgBouncer and RequireEnv is not set, and
// fails otherwise.
func SkipPgBouncer(t testing.TB, err error) {
	t.Helper()
	if errors.Is(err, ErrNoPgBouncer) && !Required() {
		t.Skipf("%v (set %s=1 to fail instead)", err, RequireEnv)
	}
	t.Fatalf("no pgbouncer: %v", err)
}

// Run runs a package's tests (m.Run), stops srv (which may be nil), then
// fails the run if a goroutine is left, and returns the exit code for
// os.Exit. The server's own goroutines go away with it, so the check comes
// after it stops. (goleak.VerifyTestMain with a Cleanup that stops the
// server would check before the server stops, and would not fail the run:
// with a Cleanup, goleak leaves the exit to it.)
func Run(m *testing.M, srv *Server) int {
	code := m.Run()
	srv.Stop()
	if err := goleak.Find(); err != nil {
		fmt.Fprintln(os.Stderr, "goleak:", err)
		if code == 0 {
			code = 1
		}
	}
	return code
}
