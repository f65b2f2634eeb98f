package reliability_test

import (
	"context"
	"os"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/idemkit/idempotency/internal/redistest"
)

// EnvLevel selects the reliability suite: "short" (what CI runs) or "full"
// (make test-reliability). Unset, the storms are skipped and only the
// checker's own tests run.
const EnvLevel = "IDEMPOTENCY_TEST_RELIABILITY"

// ignoreProbe ignores go-redis's own dial probe: after PoolSize failed dials
// (a Redis that is down), go-redis probes the server from a goroutine that
// sleeps a second and then exits, even after Close. It is go-redis's, not
// ours, and bounded.
var ignoreProbe = goleak.IgnoreAnyFunction("github.com/redis/go-redis/v9/internal/pool.(*ConnPool).tryDial")

func TestMain(m *testing.M) {
	// go-redis logs every failed dial; the storms' faults make thousands.
	redis.SetLogger(quiet{})
	goleak.VerifyTestMain(cleanFleet{redistest.Main(m)}, ignoreProbe)
}

// cleanFleet removes the fleet storms' worker binaries after the tests.
type cleanFleet struct{ m goleak.TestingM }

func (c cleanFleet) Run() int {
	defer removeFleetBinaries()
	return c.m.Run()
}

// quiet is a go-redis logger that says nothing.
type quiet struct{}

func (quiet) Printf(context.Context, string, ...any) {}

// level is the selected level of the suite.
type level int

const (
	levelOff level = iota
	levelShort
	levelFull
)

// suiteLevel returns the level EnvLevel selects, or skips t when it selects
// none. An unknown value fails t.
func suiteLevel(t *testing.T) level {
	t.Helper()
	switch v := strings.ToLower(strings.TrimSpace(os.Getenv(EnvLevel))); v {
	case "":
		t.Skipf("reliability suite off: set %s=short or %s=full (make test-reliability-short, make test-reliability)", EnvLevel, EnvLevel)
	case "short":
		return levelShort
	case "full":
		return levelFull
	default:
		t.Fatalf("%s=%q: want short or full", EnvLevel, v)
	}
	return levelOff
}
