// Package embedredis starts an embedded Redis (miniredis) for the examples
// that run on Redis (examples/fxapp, idemgrpc's), when
// IDEMPOTENCY_REDIS_URL is unset, so that each runs with one command.
// miniredis keeps everything in memory and is gone when the app stops: good
// for trying an example, not for production.
package embedredis

import (
	"fmt"

	"github.com/alicebob/miniredis/v2"
	"go.uber.org/fx"
	"go.uber.org/zap"

	"github.com/idemkit/idempotency"
)

// When returns the option that, when on is true, starts an embedded Redis
// and points the idempotency module at it; off, it adds nothing. It changes only the module's Redis URL,
// through the module's settings override group, so the module still
// builds, pings, logs and closes its own Redis client exactly as it does
// with a real server.
func When(on bool) fx.Option {
	if !on {
		return fx.Options()
	}
	return fx.Options(
		fx.Provide(Start),
		fx.Provide(fx.Annotate(
			func(m *miniredis.Miniredis) idempotency.SettingsOverride {
				return func(s *idempotency.Settings) { s.RedisURL = "redis://" + m.Addr() + "/0" }
			},
			fx.ResultTags(`group:"`+idempotency.SettingsOverrides+`"`),
		)),
	)
}

// Start starts miniredis on a free port and closes it when the app stops.
// It starts the server while fx builds the graph, rather than in an OnStart
// hook, because the module needs the address when it builds its Redis
// client, which is before any hook runs. Its OnStop hook is appended before
// the module's, so it runs after the module closed its client.
func Start(lc fx.Lifecycle, log *zap.Logger) (*miniredis.Miniredis, error) {
	m := miniredis.NewMiniRedis()
	if err := m.StartAddr("127.0.0.1:0"); err != nil {
		return nil, fmt.Errorf("start embedded redis: %w", err)
	}
	log.Warn(fmt.Sprintf("IDEMPOTENCY_REDIS_URL is unset: using an embedded Redis (miniredis) at %s; set it to use a real server", m.Addr()))
	lc.Append(fx.StopHook(m.Close))
	return m, nil
}
