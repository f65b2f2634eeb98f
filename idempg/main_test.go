package idempg_test

import (
	"errors"
	"fmt"
	"os"
	"testing"

	"github.com/idemkit/idempotency/idempg/internal/pgtest"
)

// server is the PostgreSQL server of this package's tests, started by
// TestMain; nil when none could be started, and then serverErr says why.
var (
	server    *pgtest.Server
	serverErr error
)

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) != "" {
		// A child process of TestTwoProcesses: one call, then exit.
		os.Exit(child())
	}
	if os.Getenv(stormChildEnv) != "" {
		// A client process of TestStormProcessKilled: calls until its
		// stdin ends, or it is killed.
		os.Exit(stormChild())
	}
	if os.Getenv(checkoutChildEnv) != "" {
		// A client process of TestCheckoutStorm: checkouts until its
		// stdin ends, or it kills itself.
		os.Exit(checkoutChild())
	}
	if os.Getenv(holderEnv) != "" {
		// A holder process of TestDeadAndFrozenHolders: it claims a key,
		// then dies or freezes with it.
		os.Exit(holder())
	}
	server, serverErr = pgtest.Start()
	if serverErr != nil && (!errors.Is(serverErr, pgtest.ErrNotFound) || pgtest.Required()) {
		fmt.Fprintln(os.Stderr, serverErr)
		os.Exit(1)
	}
	if server != nil {
		fmt.Fprintf(os.Stderr, "idempg tests: PostgreSQL %s at %s\n", server.Version, server.DSN)
	}
	os.Exit(pgtest.Run(m, server))
}
