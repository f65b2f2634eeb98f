package redisrepo

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/idemkit/idempotency/coordinator/idemstore"

	"github.com/redis/go-redis/v9"
)

// Info describes the record under one key, for an operator; see
// Store.Inspect.
type Info struct {
	// Key is the key that was inspected.
	Key idemstore.Key
	// RedisKey is the name of the Redis key that holds the record.
	RedisKey string
	// State is idemstore.StateAbsent (no record), idemstore.StatePending
	// (a caller holds the key: in flight), idemstore.StateCompleted (a
	// result is stored and replayed), idemstore.StateNotReplayable (the
	// action completed but its result could not be kept: calls get
	// coordinator.ErrNotReplayable) or idemstore.StateUnreadable
	// (something this package cannot read, which the coordinator replaces at
	// the next call).
	State idemstore.State
	// TTL is the remaining time to live: when Redis removes the record. It
	// is 0 for an absent key, and negative for a key without an expiry,
	// which Redis never removes by itself (this package never writes one).
	TTL time.Duration
	// CreatedAt is when the record was written, by the Redis server's clock
	// (the reservation, for a completed record); the zero time when unknown.
	CreatedAt time.Time
	// Fingerprint is the request fingerprint stored with the record, "" for
	// none or when the record is unreadable.
	Fingerprint string
	// ResultSize is the size in bytes of a completed record's result, or of
	// a not-replayable record's reason.
	ResultSize int
}

// maxBatch is the most keys one Inspect or Forget script call takes.
const maxBatch = 512

// Inspect describes the records under keys, in their order and without their
// results, and changes nothing; on Redis Cluster it takes one round trip per
// node. It returns an error, and no Info, when a call to Redis fails.
func (s *Store) Inspect(ctx context.Context, keys ...idemstore.Key) ([]Info, error) {
	if len(keys) == 0 {
		return nil, nil
	}
	infos := make([]Info, len(keys))
	names := make([]string, len(keys))
	for i, k := range keys {
		infos[i].Key = k
		infos[i].RedisKey = s.Key(k)
		names[i] = infos[i].RedisKey
	}
	bs := s.batches(names)
	replies, err := s.runBatches(ctx, inspectScript, bs)
	if err != nil {
		return nil, fmt.Errorf("redisrepo: inspect: %w", err)
	}
	for i, b := range bs {
		a, ok := replies[i].([]any)
		if !ok || len(a) != 5*len(b.keys) {
			return nil, fmt.Errorf("redisrepo: inspect: unexpected script reply %T", replies[i])
		}
		for j, at := range b.at {
			if err := decodeInfo(&infos[at], a[5*j:5*j+5]); err != nil {
				return nil, fmt.Errorf("redisrepo: inspect: %w", err)
			}
		}
	}
	return infos, nil
}

// decodeInfo fills in from one entry {state, fingerprint, result size,
// created_ms, pttl} of the reply of inspect.lua.
func decodeInfo(in *Info, a []any) error {
	code, ok1 := a[0].(int64)
	fp, ok2 := a[1].(string)
	size, ok3 := a[2].(int64)
	created, ok4 := a[3].(string)
	pttl, ok5 := a[4].(int64)
	state, ok6 := decodeState(code)
	if !ok1 || !ok2 || !ok3 || !ok4 || !ok5 || !ok6 {
		return fmt.Errorf("unexpected script reply %v", a)
	}
	in.State = state
	in.Fingerprint = fp
	in.ResultSize = int(size)
	if ms, err := strconv.ParseInt(created, 10, 64); err == nil && ms > 0 {
		in.CreatedAt = time.UnixMilli(ms)
	}
	switch {
	case pttl >= 0:
		in.TTL = time.Duration(pttl) * time.Millisecond
	case pttl == -1: // no expiry
		in.TTL = -1
	}
	return nil
}

// Forget deletes the records under keys, whoever owns them and whatever
// their state, and returns how many it deleted: a completed key can then be
// retried, and a forgotten pending key lets a second caller run while the
// first still runs (whose completion is then refused as a lost lease). It
// returns an error when a call to Redis fails; the batches sent before stay
// deleted.
func (s *Store) Forget(ctx context.Context, keys ...idemstore.Key) (int, error) {
	if len(keys) == 0 {
		return 0, nil
	}
	names := make([]string, len(keys))
	for i, k := range keys {
		names[i] = s.Key(k)
	}
	replies, err := s.runBatches(ctx, forgetScript, s.batches(names))
	n := 0
	for _, r := range replies {
		if c, ok := r.(int64); ok {
			n += int(c)
		}
	}
	if err != nil {
		return n, fmt.Errorf("redisrepo: forget: %w", err)
	}
	return n, nil
}

// batch is the keys of one multi-key script call.
type batch struct {
	keys []string
	at   []int // at[i] is the position of keys[i] in the caller's list
}

// batches splits names into the batches of multi-key script calls, of at
// most maxBatch keys each. The keys of one call must live on one node:
//   - a *redis.Client talks to one server (standalone, or the master that
//     Sentinel names): any keys go together;
//   - a *redis.ClusterClient: keys go together when they are in the same
//     hash slot (a multi-key call across slots fails with CROSSSLOT);
//   - any other client (a *redis.Ring, which shards by its own hash, or a
//     wrapper): one key per call.
func (s *Store) batches(names []string) []batch {
	var bs []batch
	switch s.client.(type) {
	case *redis.Client:
		for start := 0; start < len(names); start += maxBatch {
			end := min(start+maxBatch, len(names))
			b := batch{keys: names[start:end], at: make([]int, end-start)}
			for i := range b.at {
				b.at[i] = start + i
			}
			bs = append(bs, b)
		}
	case *redis.ClusterClient:
		bySlot := make(map[int]int) // slot -> index in bs of its open batch
		for i, name := range names {
			slot := hashSlot(name)
			j, ok := bySlot[slot]
			if !ok || len(bs[j].keys) == maxBatch {
				j = len(bs)
				bySlot[slot] = j
				bs = append(bs, batch{})
			}
			bs[j].keys = append(bs[j].keys, name)
			bs[j].at = append(bs[j].at, i)
		}
	default:
		bs = make([]batch, len(names))
		for i := range names {
			bs[i] = batch{keys: names[i : i+1 : i+1], at: []int{i}}
		}
	}
	return bs
}

// pipeliner is the optional part of a Client that runBatches uses.
type pipeliner interface {
	Pipeline() redis.Pipeliner
}

// runBatches runs sc once per batch and returns the replies, in the order of
// bs. With more than one batch and a Client that pipelines, it sends them all
// in one pipeline (a ClusterClient sends one pipeline per node, at once; more
// than maxPipeline batches go in pipelines of maxPipeline, one after the other),
// then sends again with EVAL those that met a server without the script
// cached. The replies of the batches that went through are returned with the
// first error.
func (s *Store) runBatches(ctx context.Context, sc *redis.Script, bs []batch) ([]any, error) {
	replies := make([]any, len(bs))
	p, ok := s.client.(pipeliner)
	if !ok || len(bs) == 1 {
		for i, b := range bs {
			v, err := sc.Run(ctx, s.client, b.keys).Result()
			if err != nil {
				return replies, replyError(err)
			}
			replies[i] = v
		}
		return replies, nil
	}

	cmds := make([]*redis.Cmd, len(bs))
	for start := 0; start < len(bs); start += maxPipeline {
		pipe := p.Pipeline()
		for i := start; i < min(start+maxPipeline, len(bs)); i++ {
			cmds[i] = sc.EvalSha(ctx, pipe, bs[i].keys)
		}
		execPipeline(ctx, pipe)
	}
	var again redis.Pipeliner
	for i, c := range cmds {
		if isNoScript(c.Err()) {
			if again == nil {
				again = p.Pipeline()
			}
			cmds[i] = sc.Eval(ctx, again, bs[i].keys)
		}
	}
	if again != nil {
		execPipeline(ctx, again)
	}
	var first error
	for i, c := range cmds {
		v, err := c.Result()
		if err != nil {
			if first == nil {
				first = replyError(err)
			}
			continue
		}
		replies[i] = v
	}
	return replies, first
}

func isNoScript(err error) bool {
	return err != nil && (errors.Is(err, redis.ErrNoScript) || redis.HasErrorPrefix(err, "NOSCRIPT"))
}

// replyError keeps redis.Nil inside the package.
func replyError(err error) error {
	if errors.Is(err, redis.Nil) {
		return errNilReply
	}
	return err
}
