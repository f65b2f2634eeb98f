package redisrepo_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idempotency/coordinator/idemstore"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idempotency/internal/redistest"
	"github.com/idemkit/idempotency/redisrepo"
)

// eachBackend runs fn in a subtest per Redis the Store supports: a real
// standalone server, a real three-master cluster (skipped without the
// binaries), and miniredis. The client is closed when the subtest ends.
func eachBackend(t *testing.T, fn func(t *testing.T, c redis.UniversalClient)) {
	t.Helper()
	t.Run("Redis", func(t *testing.T) { fn(t, redistest.Server(t)) })
	t.Run("Cluster", func(t *testing.T) { fn(t, redistest.Cluster(t)) })
	t.Run("Miniredis", func(t *testing.T) {
		c, _ := redistest.Miniredis(t)
		fn(t, c)
	})
}

// newStore returns a Store on c with a key prefix of t's own.
func newStore(t testing.TB, c redisrepo.Client) *redisrepo.Store {
	t.Helper()
	return redisrepo.New(c, redisrepo.WithKeyPrefix(redistest.Prefix(t)))
}

// token returns a fresh owner token, as the coordinator makes them.
func token() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// newKey returns a key no other test uses.
func newKey(name string) idemstore.Key {
	return idemstore.Key{Operation: "test.op", Key: name + "-" + rand.Text()}
}

func pendingWrite(tok, fp string, ttl time.Duration) idemstore.Write {
	return idemstore.Write{State: idemstore.StatePending, Token: tok, Fingerprint: fp, TTL: ttl}
}

func completedWrite(tok, fp string, result []byte, ttl time.Duration) idemstore.Write {
	return idemstore.Write{State: idemstore.StateCompleted, Token: tok, Fingerprint: fp, Result: result, TTL: ttl}
}

func mustReserve(t testing.TB, s *redisrepo.Store, key idemstore.Key, w idemstore.Write) {
	t.Helper()
	rec, ok, err := s.Reserve(context.Background(), key, w)
	if err != nil || !ok {
		t.Fatalf("Reserve(%s) = %+v, %v, %v; want written", key, rec, ok, err)
	}
}

func mustGet(t testing.TB, s *redisrepo.Store, key idemstore.Key) idemstore.Record {
	t.Helper()
	rec, err := s.Get(context.Background(), key)
	if err != nil {
		t.Fatalf("Get(%s): %v", key, err)
	}
	return rec
}

// roundTrips counts the commands and pipelines that reach Redis: one per
// round trip. Add it to a *redis.Client with AddHook, or to every node of a
// *redis.ClusterClient with OnNewNode, so that redirections count too. It
// leaves out what go-redis sends on its own: the handshake of a new
// connection, and a cluster client's reading of the slot map and (once) of
// the command table.
type roundTrips struct {
	n atomic.Int64
}

func (r *roundTrips) DialHook(next redis.DialHook) redis.DialHook { return next }

func (r *roundTrips) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if !handshake[cmd.Name()] {
			r.n.Add(1)
		}
		return next(ctx, cmd)
	}
}

func (r *roundTrips) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if len(cmds) > 0 && !handshake[cmds[0].Name()] {
			r.n.Add(1)
		}
		return next(ctx, cmds)
	}
}

// handshake holds the commands of go-redis's own, which a Store does not
// send.
var handshake = map[string]bool{"hello": true, "client": true, "auth": true, "select": true, "readonly": true, "cluster": true, "command": true}

// count returns the round trips that fn makes.
func (r *roundTrips) count(fn func()) int64 {
	before := r.n.Load()
	fn()
	return r.n.Load() - before
}
