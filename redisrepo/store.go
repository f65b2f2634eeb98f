package redisrepo

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idempotency/coordinator"
)

// Client is the part of a go-redis client that a Store uses: running Lua
// scripts. *redis.Client (standalone, or Sentinel failover),
// *redis.ClusterClient, *redis.Ring and every redis.UniversalClient satisfy
// it. A Client that also has a Pipeline method (all of those do) lets the
// bulk operator calls, Inspect and Forget, send their scripts in one pipeline.
//
// Build the client with ContextTimeoutEnabled: true. Without it go-redis
// bounds socket reads by its own ReadTimeout (5s by default) and ignores the
// context's deadline, so the coordinator's storage timeout would not bound a
// call on a hung Redis. idempotency.NewRedisClient sets it.
type Client interface {
	redis.Scripter
}

// Store is a coordinator.Store on Redis. Each record is a small HASH under
// one key, and each method is one Lua script touching only that key: one
// round trip, atomic on the server, and unchanged on Redis Cluster. Create a
// Store with New; it is safe for concurrent use.
//
// The methods return a *coordinator.StorageError when the call to Redis
// fails (the network, a timeout, a cancelled context, a server error); it
// unwraps to the go-redis error. Something under a key that is not a record
// this package can read is not an error: it is reported as
// coordinator.StateUnreadable, so that the coordinator heals the key.
type Store struct {
	client Client
	prefix string
}

var _ coordinator.Store = (*Store)(nil)

// New returns a Store that keeps its records through client. Without options
// the keys have the prefix DefaultKeyPrefix.
func New(client Client, opts ...Option) *Store {
	s := &Store{client: client, prefix: DefaultKeyPrefix}
	for _, o := range opts {
		o.apply(s)
	}
	return s
}

// Key returns the name of the Redis key that holds the record of key:
// prefix + operation + ":" + key.
func (s *Store) Key(key coordinator.Key) string {
	return s.prefix + key.Operation + ":" + key.Key
}

// LoadScripts loads the Store's Lua scripts into the script cache of the
// server (on a cluster, of every master), so that the first call of each
// method costs one round trip and not two (EVALSHA, NOSCRIPT, EVAL). Calling
// it is optional: a method whose script is not cached falls back to EVAL by
// itself. It returns an error when Redis fails.
func (s *Store) LoadScripts(ctx context.Context) error {
	for _, sc := range scripts {
		if err := sc.Load(ctx, s.client).Err(); err != nil {
			return fmt.Errorf("redisrepo: load scripts: %w", replyError(err))
		}
	}
	return nil
}

// The arguments of the scripts that are always the same.
const (
	argPending   = "pending"
	argCompleted = "completed"
	argReplace   = "1"
	argNoReplace = "0"
)

// Reserve implements coordinator.Store: reserve-or-read in one script. If the
// key is absent, or w.Replace is set and the record under the key is not
// pending and has token w.ReplaceToken, it writes w with time to live w.TTL
// and returns (coordinator.Record{}, true, nil). Otherwise it returns the
// record under the key and false. An unreadable record has token "", so
// w.ReplaceToken "" replaces it.
//
// It returns a *coordinator.StorageError when Redis fails, when w.State is
// neither coordinator.StatePending nor coordinator.StateCompleted, or when
// w.TTL is not positive.
func (s *Store) Reserve(ctx context.Context, key coordinator.Key, w coordinator.Write) (coordinator.Record, bool, error) {
	ttl, err := millis(w.TTL)
	if err != nil {
		return coordinator.Record{}, false, storageError(coordinator.MethodReserve, err)
	}
	// Constants boxed in an interface cost no allocation; keep them so.
	var state, result any = nil, ""
	switch w.State {
	case coordinator.StatePending:
		state = argPending
	case coordinator.StateCompleted:
		state = argCompleted
		result = w.Result
	default:
		return coordinator.Record{}, false, storageError(coordinator.MethodReserve,
			fmt.Errorf("redisrepo: cannot write a record in state %s", w.State))
	}
	var replace, replaceToken any = argNoReplace, ""
	if w.Replace {
		replace, replaceToken = argReplace, w.ReplaceToken
	}
	v, err := reserveScript.Run(ctx, s.client, []string{s.Key(key)},
		state, w.Token, w.Fingerprint, result, ttl, replace, replaceToken).Result()
	if err != nil {
		return coordinator.Record{}, false, storageError(coordinator.MethodReserve, err)
	}
	if n, ok := v.(int64); ok && n == 1 {
		return coordinator.Record{}, true, nil
	}
	rec, err := decodeRecord(v)
	if err != nil {
		return coordinator.Record{}, false, storageError(coordinator.MethodReserve, err)
	}
	return rec, false, nil
}

// Get implements coordinator.Store: it returns the record under key, with
// its remaining time to live; a missing key is a Record with State
// coordinator.StateAbsent and a nil error. It returns a
// *coordinator.StorageError when Redis fails.
func (s *Store) Get(ctx context.Context, key coordinator.Key) (coordinator.Record, error) {
	v, err := getScript.Run(ctx, s.client, []string{s.Key(key)}).Result()
	if err != nil {
		return coordinator.Record{}, storageError(coordinator.MethodGet, err)
	}
	if n, ok := v.(int64); ok && n == 0 {
		return coordinator.Record{}, nil
	}
	rec, err := decodeRecord(v)
	if err != nil {
		return coordinator.Record{}, storageError(coordinator.MethodGet, err)
	}
	return rec, nil
}

// Complete implements coordinator.Store: if key holds a pending record owned
// by token, it makes it a completed record with result and time to live ttl,
// keeping its token and fingerprint, and reports true. It returns a
// *coordinator.StorageError when Redis fails or ttl is not positive.
func (s *Store) Complete(ctx context.Context, key coordinator.Key, token string, result []byte, ttl time.Duration) (bool, error) {
	ms, err := millis(ttl)
	if err != nil {
		return false, storageError(coordinator.MethodComplete, err)
	}
	return s.ownerScript(ctx, completeScript, coordinator.MethodComplete, key, token, result, ms)
}

// Release implements coordinator.Store: if key holds a pending record owned
// by token, it deletes it and reports true. It returns a
// *coordinator.StorageError when Redis fails.
func (s *Store) Release(ctx context.Context, key coordinator.Key, token string) (bool, error) {
	return s.ownerScript(ctx, releaseScript, coordinator.MethodRelease, key, token)
}

// Renew implements coordinator.Store: if key holds a pending record owned by
// token, it sets its time to live to lease and reports true; false means the
// lease is lost. It returns a *coordinator.StorageError when Redis fails or
// lease is not positive.
func (s *Store) Renew(ctx context.Context, key coordinator.Key, token string, lease time.Duration) (bool, error) {
	ms, err := millis(lease)
	if err != nil {
		return false, storageError(coordinator.MethodRenew, err)
	}
	return s.ownerScript(ctx, renewScript, coordinator.MethodRenew, key, token, ms)
}

// ownerScript runs one of the scripts that act only for the owner of a
// pending record; they reply 1 when they did, 0 when they did not.
func (s *Store) ownerScript(ctx context.Context, sc *redis.Script, m coordinator.Method, key coordinator.Key, args ...any) (bool, error) {
	v, err := sc.Run(ctx, s.client, []string{s.Key(key)}, args...).Result()
	if err != nil {
		return false, storageError(m, err)
	}
	n, ok := v.(int64)
	if !ok || (n != 0 && n != 1) {
		return false, storageError(m, fmt.Errorf("redisrepo: unexpected script reply %T %v", v, v))
	}
	return n == 1, nil
}

// millis returns d in whole milliseconds, rounded up: a lease is never
// shorter than asked. d must be positive.
func millis(d time.Duration) (int64, error) {
	if d <= 0 {
		return 0, fmt.Errorf("redisrepo: time to live %v is not positive", d)
	}
	// Round up without overflowing: d+999999ns overflows near MaxInt64, and
	// a negative PEXPIRE deletes the key.
	ms := int64(d / time.Millisecond)
	if d%time.Millisecond != 0 {
		ms++
	}
	return ms, nil
}

// errNilReply replaces redis.Nil, which no script of this package returns:
// redis.Nil never leaves the package.
var errNilReply = errors.New("redisrepo: unexpected nil reply")

// storageError wraps err, an error of a call to Redis, for method m.
func storageError(m coordinator.Method, err error) *coordinator.StorageError {
	return &coordinator.StorageError{Method: m, Err: replyError(err)}
}
