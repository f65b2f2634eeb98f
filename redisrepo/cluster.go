package redisrepo

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/redis/go-redis/v9"
)

// Riding through a resharding (issue 34). While redis-cli --cluster moves
// slots (reshard, rebalance, add-node, del-node), a Redis Cluster answers
// some commands with replies that say "not here, not now", never "failed":
// MOVED (the client's slot map is stale), ASK (the slot is being migrated),
// TRYAGAIN, CLUSTERDOWN ("Hash slot not served": a node that does not know
// the slot's owner yet, or a node just removed and reset), and a node that
// was removed refuses connections. None of them ran the command. go-redis
// follows them, but a fixed number of times (ClusterOptions.MaxRedirects, 3:
// four tries in some 100ms, measured), which a slot in flight outlasts; and
// it reloads its slot map from one random node it knows, a removed one too.
// A storm measured some twenty such storage errors per resharding, and with
// on-storage-error "run" keys ran twice. So a store call retries them, backed
// off, until its context's deadline (the coordinator's storage timeout), and
// asks the client to reload its slot map each time. What is still failing at
// the deadline is an outage: a master that died with no replica to promote
// fails every call on its slots within the storage timeout, as before.

// The back-off between two tries of a command that met a resharding reply:
// short, since a slot's hand-over takes milliseconds, growing, so that a
// longer one (a cluster converging after del-node) is not hammered.
const (
	minClusterBackoff = 2 * time.Millisecond
	maxClusterBackoff = 64 * time.Millisecond
)

// clusterRetryBound bounds the retries of a call whose context has no
// deadline: the coordinator's default storage timeout. A coordinator always
// gives its store calls a deadline; this is for other callers.
const clusterRetryBound = time.Second

// reloader is a client that can reload its Redis Cluster slot map:
// *redis.ClusterClient (ReloadState, which reloads in the background at most
// once per 200ms however often it is asked).
type reloader interface {
	ReloadState(ctx context.Context)
}

// resharding reports whether err is a reply that a Redis Cluster gives
// while slots move, which means the command did not run: MOVED, ASK,
// TRYAGAIN, CLUSTERDOWN or LOADING. Another node (or the same, later)
// serves it.
func resharding(err error) bool {
	if err == nil {
		return false
	}
	if _, moved := redis.IsMovedError(err); moved {
		return true
	}
	if _, ask := redis.IsAskError(err); ask {
		return true
	}
	return redis.IsTryAgainError(err) || redis.IsClusterDownError(err) || redis.IsLoadingError(err)
}

// refused reports whether err is a failed dial: the command was never
// sent. On a cluster it is also what a node removed from the cluster (and
// shut down) gives to a client whose slot map still names it.
func refused(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "dial"
}

// clusterRetry reports whether err, the error of a command sent through
// client, is worth sending again after a pause: a resharding reply, or, on
// a cluster client, a failed dial. A failed dial elsewhere (a standalone
// server that is down) is an outage, and fails at once as before.
func clusterRetry(client any, err error) bool {
	if err == nil {
		return false
	}
	if resharding(err) {
		return true
	}
	_, cluster := client.(reloader)
	return cluster && refused(err)
}

// rideThrough sends a command again with send, after err, its last error,
// until it succeeds, fails otherwise, or ctx's deadline (clusterRetryBound
// from now without one) is too close for another try. Before each try it
// asks client, when it is a cluster client, to reload its slot map, and
// waits a back-off that doubles from minClusterBackoff to
// maxClusterBackoff. It returns the last error: the cluster's reply, not
// the context's, when the deadline ends it; a try that the deadline cut
// short returns the context's error, which names that reply too. ctx
// cancelled ends it at once.
func rideThrough(ctx context.Context, client any, err error, send func() error) error {
	deadline, ok := ctx.Deadline()
	if !ok {
		deadline = time.Now().Add(clusterRetryBound)
	}
	r, _ := client.(reloader)
	var t *time.Timer
	defer func() {
		if t != nil {
			t.Stop()
		}
	}()
	for backoff := minClusterBackoff; clusterRetry(client, err); backoff = min(2*backoff, maxClusterBackoff) {
		if time.Until(deadline) <= backoff {
			return err
		}
		if r != nil {
			r.ReloadState(ctx)
		}
		if t == nil {
			t = time.NewTimer(backoff)
		} else {
			t.Reset(backoff)
		}
		select {
		case <-ctx.Done():
			return err
		case <-t.C:
		}
		last := err
		if err = send(); errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
			return fmt.Errorf("%w (retrying after: %v)", err, last)
		}
	}
	return err
}

// clusterHook is the redis.Hook of AddClusterRetry.
type clusterHook struct{ client *redis.ClusterClient }

// AddClusterRetry makes client ride through a resharding: a command that
// meets MOVED, ASK, TRYAGAIN, CLUSTERDOWN or LOADING after go-redis's own
// redirections, or a refused connection (a node removed from the cluster),
// is sent again, backed off (2ms doubling to 64ms) and with the slot map
// reloaded, until it gets another answer or its context's deadline is too
// close (1s without a deadline); it then returns the last reply. Each of
// those replies means the command did not run, so sending it again is safe
// for any command. A command that succeeds costs the hook nothing.
//
// idempotency.NewRedisClient adds it to the cluster clients it builds. A
// Store over a cluster client of your own retries its reservations, reads,
// completions, renewals and releases itself; add this hook to the client
// too, before other hooks (a circuit breaker), so that the rare paths'
// scripts (format 1 records, heals, fences) ride through as well. Add it once. Pipelines (Inspect, Forget)
// are left to go-redis.
func AddClusterRetry(client *redis.ClusterClient) {
	client.AddHook(clusterHook{client: client})
}

// DialHook implements redis.Hook: it changes nothing.
func (h clusterHook) DialHook(next redis.DialHook) redis.DialHook { return next }

// ProcessHook implements redis.Hook: it sends a command that met a
// resharding reply or a refused connection again (see AddClusterRetry).
func (h clusterHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if !clusterRetry(h.client, err) {
			return err
		}
		return rideThrough(ctx, h.client, err, func() error {
			cmd.SetErr(nil)
			return next(ctx, cmd)
		})
	}
}

// ProcessPipelineHook implements redis.Hook: it changes nothing. A
// pipeline's commands that succeeded must not be sent again, and go-redis
// follows its redirections command by command.
func (h clusterHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// process sends args as a parsed command of a Store method, and returns its
// reply; it rides through a resharding (see rideThrough) when the reply is
// one.
func (s *Store) process(ctx context.Context, args []any) (any, error) {
	cmd := redis.NewCmd(ctx, args...)
	err := s.send(ctx, cmd)
	if clusterRetry(s.client, err) {
		err = rideThrough(ctx, s.client, err, func() error {
			cmd = redis.NewCmd(ctx, args...)
			_ = s.client.Process(ctx, cmd)
			return cmd.Err()
		})
	}
	if err != nil {
		return nil, err
	}
	return cmd.Val(), nil
}

// run is process, and after NOSCRIPT (a server that lacks a hot script: see
// hotScript) the same with the script's text, with EVAL.
func (s *Store) run(ctx context.Context, args []any) (any, error) {
	v, err := s.process(ctx, args)
	if isReplyError(err, "NOSCRIPT") {
		if e := evalArgs(args); e[0] == argEval {
			return s.process(ctx, e)
		}
	}
	return v, err
}
