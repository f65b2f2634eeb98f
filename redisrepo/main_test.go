package redisrepo_test

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/idemkit/idempotency/internal/redistest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(redistest.Main(m),
		// After PoolSize failed dials (tests against a dead Redis), go-redis
		// probes the server from a goroutine that sleeps a second and then
		// exits, even after Close: go-redis's, not ours, and bounded.
		goleak.IgnoreAnyFunction("github.com/redis/go-redis/v9/internal/pool.(*ConnPool).tryDial"))
}
