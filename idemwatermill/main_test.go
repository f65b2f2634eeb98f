package idemwatermill_test

import (
	"os"
	"testing"

	"go.uber.org/goleak"

	"github.com/idemkit/idempotency/internal/redistest"
)

// TestMain runs the consumer of TestJetStreamConsumerKilledMidStream when
// the test binary is started as that consumer, and otherwise the tests,
// checking that none leaves a goroutine behind and stopping the
// redis-server and the nats-server they started.
func TestMain(m *testing.M) {
	if os.Getenv(childEnv) != "" {
		os.Exit(runChild())
	}
	goleak.VerifyTestMain(stopNATS{redistest.Main(m)},
		// go-redis probes a server it failed to dial from a goroutine that
		// sleeps a second and exits, even after Close: go-redis's, bounded.
		goleak.IgnoreAnyFunction("github.com/redis/go-redis/v9/internal/pool.(*ConnPool).tryDial"))
}
