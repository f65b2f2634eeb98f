package idempotency

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/idemkit/idempotency/coordinator/idemevent"
	"github.com/idemkit/idempotency/coordinator/idemstore"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/fx"
	"go.uber.org/zap"

	"github.com/idemkit/idempotency/coordinator"
	"github.com/idemkit/idempotency/idemotel"
	"github.com/idemkit/idempotency/observability"
	"github.com/idemkit/idempotency/redisrepo"
)

// RedisClientName is the fx name under which Module looks for an app's own
// Redis client; see UseRedisClient.
const RedisClientName = "idempotency.redis"

// ObserversGroup is the fx value group from which Module adds observers of
// the app's own to the coordinator, beside its metrics and logs:
//
//	fx.Provide(fx.Annotate(newAuditObserver,
//		fx.As(new(idemevent.Observer)),
//		fx.ResultTags(`group:"idempotency.observers"`)))
const ObserversGroup = "idempotency.observers"

// Module is the fx module of the library. Add it to an app:
//
//	fx.New(idempotency.Module, ...)
//
// and inject *coordinator.Coordinator wherever an operation must run once
// per key. Module provides:
//
//   - Settings, loaded from the IDEMPOTENCY_* environment (LoadSettings).
//     Invalid settings stop the app with an error that names the variable.
//   - idemstore.Store: the Redis store, which is also provided as
//     *redisrepo.Store for its operator tools (Inspect, Forget), e.g. for an
//     admin endpoint. Unless the app supplies its own
//     client (UseRedisClient), Module builds one from the settings, pings it
//     on start and closes it on stop. An unreachable Redis does not stop the
//     app: it is logged as a warning naming the address, and each call then
//     follows IDEMPOTENCY_ON_STORAGE_ERROR. A misconfiguration does: a Redis
//     that refuses the credentials (WRONGPASS, NOAUTH), a permission
//     (NOPERM) or the database, a TLS mismatch or a failed handshake, or a
//     server that is not Redis fails start-up with an error naming the
//     variable and the problem, never the password. With
//     IDEMPOTENCY_REDIS_AUTO_PIPELINE set, the store's commands go through
//     the client's AutoPipeliner (NewStoreClient). The client it builds has
//     a circuit breaker (AddBreaker; IDEMPOTENCY_BREAKER_FAILURES and
//     IDEMPOTENCY_BREAKER_COOLDOWN): once Redis is known to be down, calls
//     fail at once instead of each paying a storage timeout.
//     An app whose store is PostgreSQL adds idempg.Module (a module of its
//     own), which supplies a Backend: the coordinator then uses that store,
//     and no Redis client is built.
//   - *coordinator.Coordinator, configured by the settings. When
//     IDEMPOTENCY_ENABLED is false, start-up logs a warning that protection
//     is off.
//
// It uses the app's *zap.Logger and prometheus.Registerer when the graph has
// them, and prometheus.DefaultRegisterer otherwise. Without a *zap.Logger in
// the graph, its warnings and errors (an unreachable Redis at start-up, the
// kill switch off, a failing store) are written to standard error as JSON
// lines, as zap.NewProduction writes them but from level Warn up; supply
// zap.NewNop() to silence them:
//
//	fx.New(idempotency.Module, fx.Supply(zap.NewNop()), ...)
//
// On start it also sends go-redis's own log lines, which go-redis prints to
// standard error unstructured, to that logger (IDEMPOTENCY_REDIS_LOGS,
// SetRedisLogger), until it stops: go-redis has one logger per process.
//
// Module also records every call on the OpenTelemetry span of its context,
// as events and attributes (package idemotel; NewTracingObserver), unless
// IDEMPOTENCY_TRACING_ENABLED is false. As instrumentation libraries do, it
// uses the graph's trace.TracerProvider, else the global one
// (otel.GetTracerProvider), so an app that only calls otel.SetTracerProvider
// gets the events too. The events land on the span of the call's context
// whichever provider started it; an app that provides the SDK's
// *sdktrace.TracerProvider to fx provides it as the interface too
// (fx.As(new(trace.TracerProvider))) for Module to find it.
//
// Note that fx matches types exactly: an app that provides a
// *prometheus.Registry must also provide it as a prometheus.Registerer
// (fx.As) for Module to find it.
//
// A Redis Streams consumer runs with the app's lifecycle with one more
// option, ConsumeStream.
//
// Building Module in many apps in one process (one fxtest app per test) is
// fine: metrics registered by an earlier app are reused, not registered
// twice.
var Module = fx.Module("idempotency",
	fx.Provide(
		provideSettings,
		provideRedisStore,
		provideStore,
		provideCoordinator,
		provideConsumerDeps, // only for ConsumeStream: an unexported type
	),
	fx.Provide(fx.Private, provideObserver, provideLogger, provideRedisBuilder),
)

// UseRedisClient points Module at a Redis client the app already has in its
// graph, of type C (*redis.Client, *redis.ClusterClient,
// redis.UniversalClient, ...), instead of building one from
// IDEMPOTENCY_REDIS_URL. The app owns that client: Module neither pings nor
// closes it. With IDEMPOTENCY_REDIS_AUTO_PIPELINE set, the store goes through
// that client's AutoPipeliner, which closes with the client (see
// NewStoreClient). One line:
//
//	fx.New(idempotency.Module, idempotency.UseRedisClient[*redis.Client](), ...)
func UseRedisClient[C redis.UniversalClient]() fx.Option {
	return fx.Provide(fx.Annotate(
		func(c C) redis.UniversalClient { return c },
		fx.ResultTags(`name:"`+RedisClientName+`"`),
	))
}

// SettingsOverride changes the module's settings after they are loaded; an
// app or a test provides it to the SettingsOverrides value group
// (OverrideSettings and OverrideSettingsWith do). The changed settings are
// validated again.
// Overrides run in no guaranteed order, so two should not set one field.
type SettingsOverride func(*Settings)

// SettingsOverrides is the fx value group of SettingsOverride values.
const SettingsOverrides = "idempotency.settings"

// SettingsBaseName is the fx name of an optional Settings value that Module
// starts from instead of the environment (fxtest.IgnoreEnvironment supplies
// it).
const SettingsBaseName = "idempotency.settings.base"

// OverrideSettings changes the module's settings after they are loaded:
//
//	idempotency.OverrideSettings(func(s *idempotency.Settings) { s.InFlight = coordinator.InFlightRaise })
//
// The changed settings are validated again. Overrides run in no guaranteed
// order, so two should not set one field. A nil change is skipped.
func OverrideSettings(change func(*Settings)) fx.Option {
	return fx.Supply(fx.Annotate(SettingsOverride(change), fx.ResultTags(`group:"`+SettingsOverrides+`"`)))
}

// OverrideSettingsWith is OverrideSettings for a change that needs a value of
// type D from the graph, such as the address of a server the app starts
// itself:
//
//	idempotency.OverrideSettingsWith(func(r *EmbeddedRedis, s *idempotency.Settings) {
//		s.RedisURL = r.URL()
//	})
//
// A nil change is skipped: it asks nothing of the graph.
func OverrideSettingsWith[D any](change func(D, *Settings)) fx.Option {
	if change == nil {
		return fx.Options()
	}
	return fx.Provide(fx.Annotate(
		func(d D) SettingsOverride { return func(s *Settings) { change(d, s) } },
		fx.ResultTags(`group:"`+SettingsOverrides+`"`),
	))
}

type settingsParams struct {
	fx.In

	Base      *Settings          `name:"idempotency.settings.base" optional:"true"`
	Overrides []SettingsOverride `group:"idempotency.settings"`
}

func provideSettings(p settingsParams) (Settings, error) {
	var s Settings
	if p.Base != nil {
		s = *p.Base
	} else {
		var err error
		if s, err = LoadSettings(); err != nil {
			return Settings{}, err
		}
	}
	if len(p.Overrides) == 0 {
		return s, nil
	}
	for _, o := range p.Overrides {
		if o != nil {
			o(&s)
		}
	}
	return s, s.Validate()
}

// moduleLogger is the logger of the module's own lines and its observer's:
// the app's *zap.Logger, or one that writes warnings and errors to standard
// error.
type moduleLogger struct{ *zap.Logger }

type loggerParams struct {
	fx.In

	Lifecycle fx.Lifecycle
	Settings  Settings
	Logger    *zap.Logger `optional:"true"`
}

func provideLogger(p loggerParams) (moduleLogger, error) {
	logger := p.Logger
	if logger == nil {
		var err error
		if logger, err = newStderrLogger(); err != nil {
			return moduleLogger{}, err
		}
	}
	// go-redis's logger is the process's, so it is set on start, not when
	// the graph is built; first, so that the start-up ping's lines go there.
	var detach func()
	p.Lifecycle.Append(fx.Hook{
		OnStart: func(context.Context) (err error) {
			detach, err = SetRedisLogger(p.Settings.RedisLogs, logger)
			return err
		},
		OnStop: func(context.Context) error {
			detach()
			return nil
		},
	})
	return moduleLogger{logger}, nil
}

type storeParams struct {
	fx.In

	Lifecycle fx.Lifecycle
	Settings  Settings
	Logger    moduleLogger
	Client    redis.UniversalClient `name:"idempotency.redis" optional:"true"`
}

// BackendName is the fx name under which Module looks for a Backend: a store
// of another kind than Redis, from a module of its own (idempg.Module
// provides one).
const BackendName = "idempotency.backend"

// A Backend is a store other than Redis for Module: with one in the graph
// under BackendName, Module's idemstore.Store is Backend.Store, Module
// builds no Redis client, and the Redis variables do not apply. Module runs
// Start and Stop with the app's lifecycle, Start with the module's logger.
type Backend struct {
	// Store is the store; not nil.
	Store idemstore.Store
	// Start, if not nil, runs on start, after the settings and before the
	// coordinator's hooks; an error stops start-up. It is where a store
	// checks that it is configured right (and logs an outage as a warning:
	// only a misconfiguration should stop an app).
	Start func(ctx context.Context, logger *zap.Logger) error
	// Stop, if not nil, runs on stop.
	Stop func(ctx context.Context) error
}

type storeChoice struct {
	fx.In

	Lifecycle fx.Lifecycle
	Settings  Settings
	Logger    moduleLogger
	Backend   *Backend `name:"idempotency.backend" optional:"true"`
	Redis     *redisBuilder
	// Base is set when the settings did not come from the environment
	// (fxtest.IgnoreEnvironment).
	Base *Settings `name:"idempotency.settings.base" optional:"true"`
}

// provideStore is the module's idemstore.Store: the app's Backend, else
// the Redis store.
func provideStore(p storeChoice) (idemstore.Store, error) {
	if p.Backend == nil {
		if p.Base == nil {
			if err := unreadDeclared(); err != nil {
				return nil, err
			}
		}
		return p.Redis.store()
	}
	if p.Backend.Store == nil {
		return nil, errors.New("idempotency: the app's Backend (" + BackendName + ") has no Store")
	}
	p.Lifecycle.Append(fx.Hook{
		OnStart: func(ctx context.Context) error {
			if p.Backend.Start == nil {
				return nil
			}
			return p.Backend.Start(ctx, p.Logger.Logger)
		},
		OnStop: func(ctx context.Context) error {
			if p.Backend.Stop == nil {
				return nil
			}
			return p.Backend.Stop(ctx)
		},
	})
	return p.Backend.Store, nil
}

// provideRedisStore is the Redis store, for its operator tools; an app whose
// store is a Backend has none.
func provideRedisStore(p storeChoice) (*redisrepo.Store, error) {
	if p.Backend != nil {
		return nil, fmt.Errorf("idempotency: the app's store is a %T (%s), not Redis: there is no *redisrepo.Store", p.Backend.Store, BackendName)
	}
	return p.Redis.store()
}

// redisBuilder builds the module's Redis store once, when the graph first
// needs it, so that an app whose store is a Backend opens no Redis client.
type redisBuilder struct {
	p     storeParams
	built *redisrepo.Store
	err   error
	done  bool
}

func provideRedisBuilder(p storeParams) *redisBuilder { return &redisBuilder{p: p} }

func (b *redisBuilder) store() (*redisrepo.Store, error) {
	if !b.done {
		b.built, b.err = buildRedisStore(b.p)
		b.done = true
	}
	return b.built, b.err
}

func buildRedisStore(p storeParams) (*redisrepo.Store, error) {
	if p.Client != nil {
		// With IDEMPOTENCY_REDIS_AUTO_PIPELINE, the app's client's
		// AutoPipeliner, which closes with that client: not the module's to
		// close either.
		sc, err := NewStoreClient(p.Settings, p.Client)
		if err != nil {
			return nil, err
		}
		return NewStore(p.Settings, sc), nil
	}
	client, err := NewRedisClient(p.Settings)
	if err != nil {
		return nil, err
	}
	if err := AddBreaker(client, p.Settings, p.Logger.Logger); err != nil {
		_ = client.Close()
		return nil, err
	}
	sc, err := NewStoreClient(p.Settings, client)
	if err != nil {
		_ = client.Close()
		return nil, err
	}
	store := NewStore(p.Settings, sc)
	p.Lifecycle.Append(fx.Hook{
		OnStart: func(ctx context.Context) error {
			err := ping(ctx, client, store, p.Settings, p.Logger.Logger)
			if err != nil {
				// fx does not run the OnStop of a hook whose OnStart
				// failed.
				_ = client.Close()
			}
			return err
		},
		// Closing the client also closes its AutoPipeliner, which first
		// sends the commands queued in it (see docs/configuration.md for a
		// hung Redis).
		OnStop: func(context.Context) error { return client.Close() },
	})
	return store, nil
}

type observerParams struct {
	fx.In

	Settings   Settings
	Logger     moduleLogger
	Registerer prometheus.Registerer `optional:"true"`
	Tracing    trace.TracerProvider  `optional:"true"`
	Extra      []idemevent.Observer  `group:"idempotency.observers"`
}

func provideObserver(p observerParams) (idemevent.Observer, error) {
	obs, err := NewObserver(p.Settings, p.Logger.Logger, p.Registerer)
	if err != nil {
		return nil, err
	}
	list := []idemevent.Observer{obs}
	if p.Settings.TracingEnabled {
		tp := p.Tracing
		if tp == nil {
			// The global provider delegates to one the app sets later, too.
			tp = otel.GetTracerProvider()
		}
		list = append(list, NewTracingObserver(p.Settings, tp))
	}
	return observability.Multi(append(list, p.Extra...)...), nil
}

// NewTracingObserver returns the Observer that records calls on the
// OpenTelemetry span of their context, as Module adds it when tracing is on
// (tp: the graph's provider, else otel.GetTracerProvider): idemotel.New with
// tp for its own spans, and with the
// key's hash on spans unless IDEMPOTENCY_LOG_KEYS is omitted (keys appear in
// spans only as a hash, whatever the mode). It does not look at
// TracingEnabled: Module does. Store spans are off; for them, set
// TracingEnabled to false and add idemotel.New(idemotel.WithStoreSpans(true))
// to ObserversGroup.
func NewTracingObserver(s Settings, tp trace.TracerProvider) *idemotel.Observer {
	return idemotel.New(
		idemotel.WithTracerProvider(tp),
		idemotel.WithKeyHash(s.LogKeys != observability.LogKeysOmitted),
	)
}

type coordinatorParams struct {
	fx.In

	Lifecycle fx.Lifecycle
	Settings  Settings
	Store     idemstore.Store
	Observer  idemevent.Observer
	Logger    moduleLogger
}

// killSwitchWarning is logged on start when IDEMPOTENCY_ENABLED is false.
const killSwitchWarning = "idempotency: protection is off (IDEMPOTENCY_ENABLED=false): every call runs its action unprotected"

func provideCoordinator(p coordinatorParams) (*coordinator.Coordinator, error) {
	c, err := NewCoordinator(p.Settings, p.Store, p.Observer)
	if err != nil {
		return nil, err
	}
	p.Lifecycle.Append(fx.Hook{
		OnStart: func(context.Context) error {
			if !p.Settings.Enabled {
				p.Logger.Warn(killSwitchWarning)
			}
			return nil
		},
		OnStop: func(ctx context.Context) error { return shutdown(ctx, c) },
	})
	return c, nil
}

// shutdown waits for the coordinator's background work on stop, leaving a
// quarter of what is left of fx's stop timeout (at most stopReserve) to the
// hooks after it, such as the Redis client's close and the app's tracer
// flush: fx runs no further hook once the timeout has passed.
func shutdown(ctx context.Context, c *coordinator.Coordinator) error {
	if deadline, ok := ctx.Deadline(); ok {
		reserve := min(stopReserve, time.Until(deadline)/4)
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, deadline.Add(-reserve))
		defer cancel()
	}
	return c.Shutdown(ctx)
}

// stopReserve is the most of fx's stop timeout that shutdown leaves to the
// hooks after the coordinator's.
const stopReserve = time.Second
