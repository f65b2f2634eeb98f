package redisrepo

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemkit/idempotency/coordinator/idemevent"
	"github.com/idemkit/idempotency/coordinator/idemstore"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idempotency/coordinator"
	"github.com/idemkit/idempotency/internal/redisreply"
)

// Client is the part of a go-redis client that a Store uses: sending
// commands and running Lua scripts. *redis.Client (standalone, or Sentinel
// failover), *redis.ClusterClient, *redis.Ring, *redis.AutoPipeliner and
// every redis.UniversalClient satisfy it. A Client that also has a Pipeline
// method (all of those do) lets the bulk operator calls, Inspect and Forget,
// send their scripts in one pipeline.
//
// Build the client with ContextTimeoutEnabled: true. Without it go-redis
// bounds socket reads by its own ReadTimeout (5s by default) and ignores the
// context's deadline, so the coordinator's storage timeout would not bound a
// call on a hung Redis. idempotency.NewRedisClient sets it.
type Client interface {
	redis.Scripter
	Process(ctx context.Context, cmd redis.Cmder) error
}

// Store is an idemstore.Store on Redis. Each record is a small STRING under
// one key, and each method is one command or one Lua script touching only
// that key: one round trip, atomic on the server, and unchanged on Redis
// Cluster. Create a Store with New; it is safe for concurrent use.
//
// The methods return a *coordinator.StorageError when the call to Redis
// fails (the network, a timeout, a cancelled context, a server error); it
// unwraps to the go-redis error. Something under a key that is not a record
// this package can read is not an error: it is reported as
// idemstore.StateUnreadable, so that the coordinator heals the key.
type Store struct {
	client   Client
	prefix   string
	format   RecordFormat
	lastMS   [2]atomic.Pointer[boxedMS] // the last lease and TTL boxed: see boxed
	channel  string                     // the wake-up channel, or its prefix when sharded; see Watch
	sharded  bool                       // Redis Cluster: sharded Pub/Sub, a channel per slot
	waiters  *waiters
	seen     *sightings        // the pending records Reserve met: see abandon
	acks     ReplicaAcks       // the writes that replicas acknowledge: see WithReplicaAcks
	lanes    int               // WithCoalescing's lanes
	hot      uncopiedProcessor // the callers' commands, coalesced; nil when off: see send
	uncopied uncopiedProcessor // client, when it sends commands uncopied; else nil: see send

	ackMu     sync.Mutex
	ackQueues map[string]*ackQueue // by master address: see ackQueue
}

var _ idemstore.Store = (*Store)(nil)

// New returns a Store that keeps its records through client. Without options
// the keys have the prefix DefaultKeyPrefix. It panics when an option is
// invalid (see Option).
func New(client Client, opts ...Option) *Store {
	s := &Store{client: client, prefix: DefaultKeyPrefix, format: Format2, lanes: DefaultLanes}
	for _, o := range opts {
		if o != nil {
			o.apply(s)
		}
	}
	if err := s.validate(); err != nil {
		panic(err)
	}
	s.channel = wakeChannelPrefix + s.prefix
	_, s.sharded = client.(*redis.ClusterClient)
	s.waiters = newWaiters(s)
	s.seen = newSightings()
	s.ackQueues = make(map[string]*ackQueue)
	s.hot = s.coalescer()
	s.uncopied, _ = client.(uncopiedProcessor)
	return s
}

// Key returns the name of the Redis key that holds the record of key:
// prefix + operation + ":" + key.
func (s *Store) Key(key idemstore.Key) string {
	return s.prefix + key.Operation + ":" + key.Key
}

// LoadScripts loads the Lua scripts into the script cache of every master,
// so that the first call of each takes one round trip, not two; it is
// optional (a call that meets a server without its script sends the text),
// and returns an error when Redis fails.
func (s *Store) LoadScripts(ctx context.Context) error {
	for _, sc := range scripts {
		if err := sc.Load(ctx, s.client).Err(); err != nil {
			return fmt.Errorf("redisrepo: load scripts: %w", replyError(err))
		}
	}
	for _, h := range hotScripts {
		if err := s.client.ScriptLoad(ctx, h.body.(string)).Err(); err != nil {
			return fmt.Errorf("redisrepo: load scripts: %w", replyError(err))
		}
	}
	return nil
}

// Arguments boxed once: passing them to go-redis costs no allocation.
var (
	argSet, argNX, argPX, argGet   any = "set", "nx", "px", "get"
	argEval, argEvalSha, argOneKey any = "eval", "evalsha", "1"
)

// Reserve implements idemstore.Store: reserve-or-read. If the key is
// absent, or w.Replace is set and the record under the key is not pending
// and has token w.ReplaceToken, it writes w with time to live w.TTL and
// returns (idemstore.Record{}, true, nil). Otherwise it returns the record
// under the key and false. An unreadable record has token "", so
// w.ReplaceToken "" replaces it.
//
// A plain reservation is one SET NX PX GET: the write, or the record that
// prevents it, in one command. A record it returns has TTL 0 (unknown),
// except one of format 1. Replace is a script (reserve.lua).
//
// When Redis refuses the write but would serve a read (a full Redis with
// maxmemory-policy noeviction, a replica, a failed snapshot: see
// writeRefused), Reserve reads the key instead, so that a completed record
// still replays and a pending one is still waited on; only an absent key,
// which needs a write, returns the refusal.
//
// It returns a *coordinator.StorageError when Redis fails, when w.State is
// not idemstore.StatePending, idemstore.StateCompleted or
// idemstore.StateNotReplayable, when
// w.TTL is not positive, or when w.Token or w.Fingerprint is too long.
func (s *Store) Reserve(ctx context.Context, key idemstore.Key, w idemstore.Write) (idemstore.Record, bool, error) {
	if s.acking(key.Operation) {
		return s.reserveAcked(ctx, key, w)
	}
	return s.reserve(ctx, key, w)
}

// reserve is Reserve without acknowledgement.
func (s *Store) reserve(ctx context.Context, key idemstore.Key, w idemstore.Write) (idemstore.Record, bool, error) {
	ttl, err := checkWrite(w)
	if err != nil {
		return idemstore.Record{}, false, storageError(idemevent.MethodReserve, err)
	}
	if s.format == Format1 {
		return s.reserve1(ctx, key, w, ttl)
	}
	c := s.newCommand(key)
	b, err := appendRecord(c.free(), w.State, w.Token, w.Fingerprint, w.Result)
	if err != nil {
		return idemstore.Record{}, false, storageError(idemevent.MethodReserve, err)
	}
	c.val = c.keep(b)
	rkey, val := c.key, b
	if !w.Replace {
		c.add(argSet, &c.key, &c.val, argNX, argPX, s.boxed(ttl, w.State == idemstore.StatePending), argGet)
		v, found, err := s.bulk(ctx, c.list()...)
		switch {
		case errors.Is(err, errWrongType):
			rec, err := s.legacy(ctx, idemevent.MethodReserve, rkey)
			if err == nil && rec.State == idemstore.StatePending {
				return reserveReply(abandon1Script.Run(ctx, s.client, []string{rkey},
					val, ttl, rec.Token).Result())
			}
			return rec, false, err
		case isReplyError(err, "ERR syntax error"): // a server before Redis 7.0
			return idemstore.Record{}, false, storageError(idemevent.MethodReserve,
				fmt.Errorf("%w (SET with NX and GET needs Redis 7.0 or newer)", err))
		case writeRefused(err):
			return s.readRefused(ctx, rkey, err)
		case err != nil:
			return idemstore.Record{}, false, storageError(idemevent.MethodReserve, err)
		case !found:
			return idemstore.Record{}, true, nil
		}
		rec := c.decode(v)
		if rec.State == idemstore.StatePending && s.seen.due(c.key, rec.Token, checkEvery(w)) {
			return s.abandon(ctx, c, rec, w, ttl)
		}
		return rec, false, nil
	}
	return reserveReply(reserveScript.Run(ctx, s.client, []string{rkey},
		val, ttl, storedToken(w.ReplaceToken), w.ReplaceToken).Result())
}

// checkWrite checks the state and the time to live of w, and returns the
// time to live in milliseconds.
func checkWrite(w idemstore.Write) (int64, error) {
	ttl, err := millis(w.TTL)
	if err != nil {
		return 0, err
	}
	if w.State != idemstore.StatePending && !hasResult(byte(w.State)) {
		return 0, fmt.Errorf("redisrepo: cannot write a record in state %s", w.State)
	}
	return ttl, nil
}

// checkEvery is how long Reserve meets one pending record with w before it
// checks whether the record is wedged (see sightings): a lease, w.TTL, for a
// reservation; no time at all for a write of a result (in-flight mode run,
// which reserves after its action ran), whose TTL is the result's, not a
// lease: it checks at its second meeting, so that a wedged record is healed
// by the second call, not after maxCheckEvery. What is wedged is decided on
// the server either way.
func checkEvery(w idemstore.Write) time.Duration {
	if w.State == idemstore.StatePending {
		return w.TTL
	}
	return 0
}

// abandon is Reserve after it met rec, a pending record under c's key, that
// it met before at least one interval ago (see sightings): it writes c's
// value (w, encoded) over it if it is wedged, with no expiry at all
// (abandon.lua), and else returns what is there. A pending record that
// nothing expires is thus never waited on for ever, and the check costs a
// collision nothing until it has met the same record for an interval: the
// common collision (a retry while the first call still runs) pays one round
// trip. The check is opportunistic: when it fails, Reserve returns rec, as
// it would have without it.
func (s *Store) abandon(ctx context.Context, c *command, rec idemstore.Record, w idemstore.Write, ttl int64) (idemstore.Record, bool, error) {
	a := &command{key: c.key, val: c.val}
	a.setToken(rec.Token)
	a.add(argEvalSha, abandonScript.sha, argOneKey, &a.key, &a.val, s.boxed(ttl, w.State == idemstore.StatePending), &a.token)
	v, found, err := s.bulk(ctx, a.list()...)
	switch {
	case errors.Is(err, errWrongType): // a format 1 HASH since
		rec, err := s.legacy(ctx, idemevent.MethodReserve, a.key)
		return rec, false, err
	case err != nil:
		return rec, false, nil
	case !found:
		return idemstore.Record{}, true, nil
	}
	return decodeValue(v), false, nil
}

// readRefused is Reserve after Redis refused its write with refused: it
// reads the record under rkey as Get does and returns it, or refused as a
// *coordinator.StorageError when the key is absent or the read fails too;
// the read's own error when Redis refused the client for it
// (coordinator.ErrMisconfigured), which no action runs for.
func (s *Store) readRefused(ctx context.Context, rkey string, refused error) (idemstore.Record, bool, error) {
	rec, err := s.get(ctx, idemevent.MethodReserve, rkey, false)
	if errors.Is(err, coordinator.ErrMisconfigured) {
		return idemstore.Record{}, false, err
	}
	if err != nil || rec.State == idemstore.StateAbsent {
		return idemstore.Record{}, false, storageError(idemevent.MethodReserve, refused)
	}
	return rec, false, nil
}

// reserveReply reads the reply of reserve.lua or reserve1.lua: 1 when it
// wrote, else the record that is there.
func reserveReply(v any, err error) (idemstore.Record, bool, error) {
	if err != nil {
		return idemstore.Record{}, false, storageError(idemevent.MethodReserve, err)
	}
	if n, ok := v.(int64); ok && n == 1 {
		return idemstore.Record{}, true, nil
	}
	rec, err := decodeReply(v)
	if err != nil {
		return idemstore.Record{}, false, storageError(idemevent.MethodReserve, err)
	}
	return rec, false, nil
}

// reserve1 is Reserve in format 1.
func (s *Store) reserve1(ctx context.Context, key idemstore.Key, w idemstore.Write, ttl int64) (idemstore.Record, bool, error) {
	return reserveReply(reserve1Script.Run(ctx, s.client, []string{s.Key(key)}, reserve1Args(w, ttl)...).Result())
}

// reserve1Args returns the arguments of reserve1.lua that write w with time
// to live ttl.
func reserve1Args(w idemstore.Write, ttl int64) []any {
	state, result := argPending, any("")
	switch w.State {
	case idemstore.StateCompleted:
		state, result = argCompleted, w.Result
	case idemstore.StateNotReplayable:
		state, result = argNotReplayable, w.Result
	}
	replace, replaceToken := argNoReplace, ""
	if w.Replace {
		replace, replaceToken = argReplace, w.ReplaceToken
	}
	return []any{state, w.Token, w.Fingerprint, result, ttl, replace, replaceToken}
}

// The arguments of the format 1 scripts that are always the same.
const (
	argPending       = "pending"
	argCompleted     = "completed"
	argNotReplayable = "not_replayable"
	argReplace       = "1"
	argNoReplace     = "0"
)

// The state bytes complete.lua writes, boxed once.
var argStateCompleted, argStateNotReplayable any = int64(stateCompleted), int64(stateNotReplayable)

// Get implements idemstore.Store: it returns the record under key; a
// missing key is a Record with State idemstore.StateAbsent and a nil
// error. It is one GET; the record's TTL is 0 (unknown), except for a record
// of format 1. It returns a *coordinator.StorageError when Redis fails.
func (s *Store) Get(ctx context.Context, key idemstore.Key) (idemstore.Record, error) {
	return s.get(ctx, idemevent.MethodGet, s.Key(key), false)
}

// get reads the record under rkey with GET or, when watch is set, with
// watch.lua.
func (s *Store) get(ctx context.Context, m idemevent.Method, rkey string, watch bool) (idemstore.Record, error) {
	if s.format == Format1 && !watch {
		// The records it writes are HASHes, which GET refuses: read with
		// legacy.lua at once (it reads a STRING too), one round trip.
		return s.legacy(ctx, m, rkey)
	}
	var v []byte
	var found bool
	var err error
	if watch {
		v, found, err = s.bulk(ctx, argEvalSha, watchScript.sha, argOneKey, rkey)
	} else {
		v, found, err = s.bulk(ctx, argGet, rkey)
	}
	switch {
	case errors.Is(err, errWrongType):
		return s.legacy(ctx, m, rkey)
	case err != nil:
		return idemstore.Record{}, storageError(m, err)
	case !found:
		return idemstore.Record{}, nil
	}
	return decodeValue(v), nil
}

// legacy reads the record under rkey, which is not a STRING: a format 1
// HASH, or something unreadable.
func (s *Store) legacy(ctx context.Context, m idemevent.Method, rkey string) (idemstore.Record, error) {
	v, err := legacyScript.Run(ctx, s.client, []string{rkey}).Result()
	if err != nil {
		return idemstore.Record{}, storageError(m, err)
	}
	if n, ok := v.(int64); ok && n == 0 {
		return idemstore.Record{}, nil
	}
	rec, err := decodeReply(v)
	if err != nil {
		return idemstore.Record{}, storageError(m, err)
	}
	return rec, nil
}

// decodeReply reads a reply that holds a record: a STRING (format 2, or
// something unreadable), or the array of legacy.lua and reserve.lua.
func decodeReply(v any) (idemstore.Record, error) {
	if str, ok := v.(string); ok {
		return decodeValue([]byte(str)), nil
	}
	return decodeLegacy(v)
}

// Complete implements idemstore.Store: if key holds a pending record owned
// by token, it makes it a record of state c.State (completed, or not
// replayable with c.Result as the reason) with c.Result and time to live
// c.TTL, keeping its token and fingerprint, and reports true. A caller that
// waits on the key in any process is woken (see Watch). It returns a
// *coordinator.StorageError when Redis fails, c.TTL is not positive or
// c.State is neither idemstore.StateCompleted nor
// idemstore.StateNotReplayable.
func (s *Store) Complete(ctx context.Context, key idemstore.Key, token string, c idemstore.Completion) (bool, error) {
	if s.acking(key.Operation) {
		return s.completeAcked(ctx, key, token, c)
	}
	return s.complete(ctx, key, token, c)
}

// complete is Complete without acknowledgement.
func (s *Store) complete(ctx context.Context, key idemstore.Key, token string, c idemstore.Completion) (bool, error) {
	ms, err := millis(c.TTL)
	if err != nil {
		return false, storageError(idemevent.MethodComplete, err)
	}
	state, state1, err := completionStates(c.State)
	if err != nil {
		return false, storageError(idemevent.MethodComplete, err)
	}
	if s.format == Format1 {
		v, err := owner1Script.Run(ctx, s.client, []string{s.Key(key)}, "complete", token, c.Result, ms, state1).Result()
		return ownerReply(idemevent.MethodComplete, v, err)
	}
	k := s.newCommand(key)
	k.setToken(token)
	k.setChannel(s)
	k.result = bytesString(c.Result)
	k.add(argEvalSha, completeScript.sha, argOneKey, &k.key, &k.token, &k.result, s.boxed(ms, false), &k.channel, state, s.publishArg())
	return s.owner(ctx, idemevent.MethodComplete, k)
}

// completionStates returns the state to write for a completion in state st:
// as complete.lua takes it, and as owner1.lua takes it (format 1).
func completionStates(st idemstore.State) (state, state1 any, err error) {
	switch st {
	case idemstore.StateCompleted:
		return argStateCompleted, argCompleted, nil
	case idemstore.StateNotReplayable:
		return argStateNotReplayable, argNotReplayable, nil
	}
	return nil, nil, fmt.Errorf("redisrepo: cannot complete a record in state %s", st)
}

// Release implements idemstore.Store: if key holds a pending record owned
// by token, it deletes it and reports true. A caller that waits on the key
// in any process is woken (see Watch). It returns a
// *coordinator.StorageError when Redis fails.
func (s *Store) Release(ctx context.Context, key idemstore.Key, token string) (bool, error) {
	if s.format == Format1 {
		return s.owner1(ctx, idemevent.MethodRelease, key, "release", token, "", 0)
	}
	c := s.newCommand(key)
	c.setToken(token)
	c.setChannel(s)
	c.add(argEvalSha, releaseScript.sha, argOneKey, &c.key, &c.token, &c.channel, s.publishArg())
	return s.owner(ctx, idemevent.MethodRelease, c)
}

// Renew implements idemstore.Store: if key holds a pending record owned by
// token, it sets its time to live to lease and reports true; false means the
// lease is lost. It returns a *coordinator.StorageError when Redis fails or
// lease is not positive.
func (s *Store) Renew(ctx context.Context, key idemstore.Key, token string, lease time.Duration) (bool, error) {
	ms, err := millis(lease)
	if err != nil {
		return false, storageError(idemevent.MethodRenew, err)
	}
	if s.format == Format1 {
		return s.owner1(ctx, idemevent.MethodRenew, key, "renew", token, "", ms)
	}
	c := s.newCommand(key)
	c.setToken(token)
	c.add(argEvalSha, renewScript.sha, argOneKey, &c.key, &c.token, s.boxed(ms, true))
	return s.owner(ctx, idemevent.MethodRenew, c)
}

// owner1 is an owner-checked step in format 1.
func (s *Store) owner1(ctx context.Context, m idemevent.Method, key idemstore.Key, step, token string, result any, ms int64) (bool, error) {
	v, err := owner1Script.Run(ctx, s.client, []string{s.Key(key)}, step, token, result, ms).Result()
	return ownerReply(m, v, err)
}

// owner runs c, one of the scripts that act only for the owner of a pending
// record, with EVALSHA, and whole with EVAL after NOSCRIPT (see hotScript),
// riding through a resharding (see Store.process).
func (s *Store) owner(ctx context.Context, m idemevent.Method, c *command) (bool, error) {
	v, err := s.run(ctx, c.list())
	return ownerReply(m, v, err)
}

// ownerReply reads the reply of an owner script: 1 when it acted, 0 when it
// did not.
func ownerReply(m idemevent.Method, v any, err error) (bool, error) {
	if err != nil {
		return false, storageError(m, err)
	}
	n, ok := v.(int64)
	if !ok || (n != 0 && n != 1) {
		return false, storageError(m, fmt.Errorf("redisrepo: unexpected script reply %T %v", v, v))
	}
	return n == 1, nil
}

// boxedMS is a time to live in milliseconds and the same, boxed.
type boxedMS struct {
	ms  int64
	box any
}

// boxed returns ms boxed, as an argument: an int64 above 255 costs an
// allocation each time it is boxed, and a coordinator passes the same lease
// on every reservation, and mostly the same TTL on every completion. It
// keeps the last lease (lease true) and the last TTL apart.
func (s *Store) boxed(ms int64, lease bool) any {
	last := &s.lastMS[0]
	if !lease {
		last = &s.lastMS[1]
	}
	if b := last.Load(); b != nil && b.ms == ms {
		return b.box
	}
	b := &boxedMS{ms: ms, box: ms}
	last.Store(b)
	return b.box
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

// storageError wraps err, an error of a call to Redis, for method m. A
// reply with which Redis refuses the client (WRONGPASS, NOAUTH, NOPERM, an
// unknown database: redisreply.Refusal) also matches
// coordinator.ErrMisconfigured: Redis answered, so the call is not an
// outage, and the coordinator never runs an action unprotected for it.
func storageError(m idemevent.Method, err error) *coordinator.StorageError {
	err = replyError(err)
	if r := redisreply.Refusal(err); r != "" {
		err = fmt.Errorf("%w (redis refused the client: %s): %w", coordinator.ErrMisconfigured, r, err)
	}
	return &coordinator.StorageError{Method: m, Err: err}
}
