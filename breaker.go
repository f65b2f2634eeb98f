package idempotency

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/idemkit/idempotency/coordinator"
	"github.com/idemkit/idempotency/internal/breaker"
	"github.com/idemkit/idempotency/internal/redisurl"
)

// ErrBreakerOpen is the error (wrapped, with how long Redis has been failing
// and its last failure) of a Redis call that the circuit breaker of
// AddBreaker refused without sending it. Out of the store it is a storage
// error like any other: calls follow IDEMPOTENCY_ON_STORAGE_ERROR.
var ErrBreakerOpen = breaker.ErrOpen

// AddBreaker adds a circuit breaker to client, as Module does to the client
// it builds (not to an app's own, UseRedisClient): after
// s.BreakerFailures consecutive connection failures (a dial error, a
// timeout, a connection that broke; not an error reply of Redis, nor a call
// whose caller cancelled it or whose context was done before it started)
// the breaker opens, and every command and pipeline fails at once with an
// error wrapping ErrBreakerOpen instead of paying a storage timeout (and
// go-redis's dial retries and their log lines). After s.BreakerCooldown
// (at most a tenth of s.Lease), one call at a time goes through as a probe:
// its success closes the breaker, its failure opens it for another
// cool-down. Each change is one line on logger: the breaker opening and
// closing at Warn, each probe and failed probe at Debug. A nil logger logs
// nothing.
//
// It never refuses a call that no caller waits for
// (coordinator.OffRequestPath: a completion retried in the background, a
// renewal of a running action's lease), so that it never makes a result
// less likely to be stored; such calls do not count as failures or
// successes either.
//
// The breaker is the client's own (a *redis.ClusterClient gets one per
// node, so that one dead master does not stop the calls to the others),
// starts no goroutine, and costs one mutex per call while closed. A node
// that refused a connection, and that the cluster's slot map, reloaded
// then, no longer routes to (a master resharded away and removed) does not
// count that failure: its breaker does not open for calls that a stale
// slot map sent it, and that the client sends again to the slot's new
// master. With
// s.BreakerFailures 0 AddBreaker does nothing. It returns an error naming
// the variable when the settings are invalid.
func AddBreaker(client redis.UniversalClient, s Settings, logger *zap.Logger) error {
	if s.BreakerFailures == 0 {
		return nil
	}
	if logger == nil {
		logger = zap.NewNop()
	}
	cooldown := s.breakerCooldown()
	newHook := func(addr string) (*breakerHook, error) {
		h := &breakerHook{}
		b, err := breaker.New(breaker.Config{
			Failures: s.BreakerFailures,
			Cooldown: cooldown,
			OnChange: func(c breaker.Change) { logBreakerChange(logger, addr, cooldown, c) },
		})
		if err != nil {
			return nil, fmt.Errorf("%s_BREAKER_FAILURES or %s_BREAKER_COOLDOWN: %w", EnvPrefix, EnvPrefix, err)
		}
		h.b = b
		return h, nil
	}
	// Refuse invalid settings now, not at a cluster's first node.
	if _, err := newHook(""); err != nil {
		return err
	}
	switch c := client.(type) {
	case *redis.ClusterClient:
		c.OnNewNode(func(node *redis.Client) {
			addr := node.Options().Addr
			h, _ := newHook(addr) // valid: checked above
			h.routed = func(ctx context.Context) bool { return routesTo(ctx, c, addr, s.StorageTimeout) }
			node.AddHook(h)
		})
		return nil
	case *redis.Client:
		addr := c.Options().Addr
		if s.topology() == redisurl.Sentinel {
			addr = s.RedisAddr()
		}
		h, err := newHook(addr)
		if err != nil {
			return err
		}
		c.AddHook(h)
		return nil
	}
	return fmt.Errorf("%s_BREAKER_FAILURES: the Redis client (%T) cannot have a circuit breaker: set it to 0", EnvPrefix, client)
}

// breakerCooldown returns the breaker's cool-down: BreakerCooldown, at most
// a tenth of the lease.
func (s Settings) breakerCooldown() time.Duration {
	if limit := s.Lease / 10; limit > 0 && s.BreakerCooldown > limit {
		return limit
	}
	return s.BreakerCooldown
}

// logBreakerChange writes the line of one change of a breaker's state.
func logBreakerChange(logger *zap.Logger, addr string, cooldown time.Duration, c breaker.Change) {
	fields := []zap.Field{zap.String("redis_addr", addr)}
	switch {
	case c.To == breaker.Open && c.From == breaker.Closed:
		logger.Warn("idempotency: redis circuit breaker open: store calls fail at once, as storage errors, until a probe finds redis back",
			append(fields, zap.Int("failures", c.Failures), zap.Duration("cooldown", cooldown), zap.Error(c.Err))...)
	case c.To == breaker.Open:
		logger.Debug("idempotency: redis circuit breaker probe failed; open for another cool-down",
			append(fields, zap.Duration("open_for", c.OpenFor), zap.Duration("cooldown", cooldown), zap.Error(c.Err))...)
	case c.To == breaker.HalfOpen:
		logger.Debug("idempotency: redis circuit breaker half-open: probing redis", fields...)
	case c.To == breaker.Closed:
		logger.Warn("idempotency: redis circuit breaker closed: redis is back",
			append(fields, zap.Duration("open_for", c.OpenFor))...)
	}
}

// breakerPass is the key of the context value that marks a call the
// breaker let through: the commands go-redis sends on its context, such as
// the HELLO and AUTH of a new connection, are part of it (and go through the
// same hooks), so the breaker must not refuse them while that call probes.
type breakerPass struct{}

// breakerHook is the go-redis hook of one client's breaker.
type breakerHook struct {
	b *breaker.Breaker
	// routed, for a node of a cluster, reports whether the cluster's slot
	// map, reloaded, still routes to the node; nil for other clients.
	routed func(context.Context) bool
}

// routeCheck is the key of the context value that marks the commands of a
// routesTo (the slot map's reload), which no breaker judges.
type routeCheck struct{}

// routesTo reports whether the slot map of c, reloaded within timeout,
// names the node at addr as a master; true when it cannot tell.
func routesTo(ctx context.Context, c *redis.ClusterClient, addr string, timeout time.Duration) bool {
	ctx, cancel := context.WithTimeout(context.WithValue(context.WithoutCancel(ctx), routeCheck{}, true), timeout)
	defer cancel()
	var found atomic.Bool
	err := c.ForEachMaster(ctx, func(_ context.Context, m *redis.Client) error {
		if m.Options().Addr == addr {
			found.Store(true)
		}
		return nil
	})
	return err != nil || found.Load()
}

// judge returns what the outcome o of a call on ctx, whose error is err,
// says about the node: a refused connection to a node that the cluster no
// longer routes to is ignored. Only a refusal is checked, which comes at
// once: a call that timed out does not wait for a reload of the slot map
// too.
func (h *breakerHook) judge(ctx context.Context, o breaker.Outcome, err error) breaker.Outcome {
	if o == breaker.Failure && h.routed != nil && errors.Is(err, syscall.ECONNREFUSED) && !h.routed(ctx) {
		return breaker.Ignored
	}
	return o
}

// passes reports whether a call on ctx goes by the breaker unjudged: it
// says nothing about Redis (its context is done), is part of a call let
// through or of a slot map's reload for the breaker, or is a save or
// renewal that no caller waits for.
func (h *breakerHook) passes(ctx context.Context) bool {
	return ctx.Err() != nil || ctx.Value(breakerPass{}) == h || ctx.Value(routeCheck{}) != nil || coordinator.OffRequestPath(ctx)
}

var _ redis.Hook = (*breakerHook)(nil)

// DialHook leaves dials alone: a call the breaker refuses never dials, and
// go-redis's own background dials (its pool's probe after failed dials) help
// it see Redis back.
func (h *breakerHook) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		return next(ctx, network, addr)
	}
}

// ProcessHook refuses a command while the breaker is open, and reports the
// outcome of the others. It never touches cmd: go-redis sets the returned
// error on it (and an auto-pipelined command must not be written to).
func (h *breakerHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if h.passes(ctx) {
			return next(ctx, cmd)
		}
		t, err := h.b.Allow()
		if err != nil {
			return err
		}
		err = next(context.WithValue(ctx, breakerPass{}, h), cmd)
		h.b.Done(t, h.judge(ctx, outcome(ctx, err), err), err)
		return err
	}
}

// ProcessPipelineHook refuses a pipeline while the breaker is open, setting
// the error on each of its commands, and reports the outcome of the others.
func (h *breakerHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if h.passes(ctx) {
			return next(ctx, cmds)
		}
		t, err := h.b.Allow()
		if err != nil {
			for _, cmd := range cmds {
				cmd.SetErr(err)
			}
			return err
		}
		err = next(context.WithValue(ctx, breakerPass{}, h), cmds)
		h.b.Done(t, h.judge(ctx, outcome(ctx, err), err), err)
		return err
	}
}

// outcome tells what err, the error of a call on ctx, says about Redis: an
// answer (none, or an error reply such as WRONGTYPE or a refusal) is a
// success, a call that its caller cancelled or that a closed client refused
// says nothing, and anything else (a dial error, a timeout, a broken
// connection) is a failure.
func outcome(ctx context.Context, err error) breaker.Outcome {
	var reply redis.Error
	switch {
	case err == nil, errors.As(err, &reply):
		return breaker.Success
	case errors.Is(err, context.Canceled), errors.Is(err, redis.ErrClosed), errors.Is(err, breaker.ErrOpen),
		errors.Is(ctx.Err(), context.Canceled):
		return breaker.Ignored
	}
	return breaker.Failure
}
