package benchmarks

import (
	"context"
	"io"
	"runtime"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idempotency/coordinator/idemevent"
	"github.com/idemkit/idempotency/coordinator/idemstore"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel"
	"go.uber.org/fx"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/coordinator"
	"github.com/idemkit/idempotency/coordinator/memstore"
	"github.com/idemkit/idempotency/fxtest"
	"github.com/idemkit/idempotency/observability"
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
	logger := discardLogger()
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

// discardLogger is the logger of impl=fx: zap.NewProduction's JSON lines at
// Info, written to io.Discard.
func discardLogger() *zap.Logger {
	return zap.New(zapcore.NewCore(zapcore.NewJSONEncoder(zap.NewProductionEncoderConfig()),
		zapcore.AddSync(io.Discard), zapcore.InfoLevel))
}

// observerKeys numbers BenchmarkObserver's first-run keys across its runs.
var observerKeys atomic.Int64

// BenchmarkObserver is what the fx module's observer costs a call, without
// the network that hides it in the other flows: the module's coordinator
// (idempotency.NewCoordinator with the default settings) over an in-memory
// store (coordinator/memstore), with no observer (impl=idemkit) and with the
// observer Module gives it by default (impl=fx: metrics on a registry of
// their own, zap at Info to io.Discard, OpenTelemetry's global provider).
// The difference of the two is the observer's time per call; a replay
// reports two events (hit and the Reserve's storage call), a first run four.
//
// Each sub-benchmark gets a coordinator and a store of its own and starts
// after a collection, so that neither impl runs beside the records the
// other's first runs left in memory: a bigger live heap makes each
// collection's marking longer, and that, not the observer, was most of the
// difference when the sub-benchmarks shared the process's heap in turn.
func BenchmarkObserver(b *testing.B) {
	ctx := context.Background()
	s := idempotency.DefaultSettings()
	withObserver := moduleObserver(b, s)
	impls := []struct {
		name string
		obs  idemevent.Observer
	}{{"idemkit", nil}, {implFx, withObserver}}
	fresh := func(b *testing.B, obs idemevent.Observer) *coordinator.Coordinator {
		b.Helper()
		co, err := idempotency.NewCoordinator(s, memstore.New(), obs)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = co.Close() })
		runtime.GC()
		return co
	}
	for _, impl := range impls {
		b.Run("flow=replay/impl="+impl.name, func(b *testing.B) {
			co := fresh(b, impl.obs)
			call := coordinator.Call{Operation: operation, Key: "replay", Fingerprint: fingerprint()}
			if _, err := coordinator.Do(ctx, co, call, runAction); err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			for b.Loop() {
				p, err := coordinator.Do(ctx, co, call, neverRun)
				if err != nil {
					b.Fatal(err)
				}
				if err := check(p); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
	for _, impl := range impls {
		b.Run("flow=first/impl="+impl.name, func(b *testing.B) {
			co := fresh(b, impl.obs)
			b.ReportAllocs()
			for b.Loop() {
				call := coordinator.Call{Operation: operation, Key: "first-" + strconv.FormatInt(observerKeys.Add(1), 36), Fingerprint: fingerprint()}
				if _, err := coordinator.Do(ctx, co, call, runAction); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// moduleObserver is the observer Module gives a coordinator by default:
// metrics on a registry of their own, zap at Info to io.Discard, and
// OpenTelemetry's global provider.
func moduleObserver(b *testing.B, s idempotency.Settings) idemevent.Observer {
	b.Helper()
	metrics, err := idempotency.NewObserver(s, discardLogger(), prometheus.NewRegistry())
	if err != nil {
		b.Fatal(err)
	}
	return observability.Multi(metrics, idempotency.NewTracingObserver(s, otel.GetTracerProvider()))
}

// BenchmarkObserverEvents is the fx module's observer alone: the two events
// a replay reports (the Reserve's storage call and the hit), passed to the
// observer Module gives the coordinator by default, as in BenchmarkObserver.
// It is what BenchmarkObserver's difference should come to.
func BenchmarkObserverEvents(b *testing.B) {
	o := moduleObserver(b, idempotency.DefaultSettings())
	ctx := context.Background()
	key := idemstore.Key{Operation: operation, Key: "replay"}
	b.ReportAllocs()
	for b.Loop() {
		o.Observe(ctx, idemevent.Event{Kind: idemevent.StorageCall, Key: key, Method: idemevent.MethodReserve, Duration: 300 * time.Microsecond})
		o.Observe(ctx, idemevent.Event{Kind: idemevent.Hit, Key: key})
	}
}
