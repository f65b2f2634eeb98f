package benchmarks

import (
	"context"
	"io"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"go.uber.org/fx"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/coordinator"
	"github.com/idemkit/idempotency/fxtest"
)

// implFx is the impl whose coordinator is the fx module's
// (idempotency.Module), with its observer as an app gets it by default:
// Prometheus metrics (on a registry of their own), zap logs (a JSON logger
// at Info, as zap.NewProduction's, writing to io.Discard) and OpenTelemetry
// (otel's global provider, which records nothing until an app sets one).
// Beside impl=idemkit, the bare coordinator, it shows what the observer
// costs. It runs in the pipe=off benchmarks.
const implFx = "fx"

// fxCoordinator returns the coordinator of an fx app over a new client of
// the benchmarks' server, with change applied to the module's settings (the
// defaults, not the environment), stopped when b ends.
func fxCoordinator(b *testing.B, change func(*idempotency.Settings)) *coordinator.Coordinator {
	b.Helper()
	c := client(b)
	logger := zap.New(zapcore.NewCore(zapcore.NewJSONEncoder(zap.NewProductionEncoderConfig()),
		zapcore.AddSync(io.Discard), zapcore.InfoLevel))
	var co *coordinator.Coordinator
	app := fx.New(
		idempotency.Module,
		fxtest.IgnoreEnvironment(),
		fx.Supply(c, logger, fx.Annotate(prometheus.NewRegistry(), fx.As(new(prometheus.Registerer)))),
		idempotency.UseRedisClient[*redis.Client](),
		idempotency.OverrideSettings(change),
		fx.Populate(&co),
		fx.NopLogger,
	)
	if err := app.Start(context.Background()); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = app.Stop(context.Background()) })
	return co
}
