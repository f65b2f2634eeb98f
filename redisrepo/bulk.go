package redisrepo

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/idemkit/idempotency/coordinator/idemevent"
	"github.com/idemkit/idempotency/coordinator/idemstore"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idempotency/coordinator"
)

// This file is idemstore.BulkStore: the single-key methods for many keys
// at once. A bulk call sends its entries' commands (the ones the single-key
// methods send: GET, SET NX GET, the same scripts with EVALSHA) in one
// pipeline, which a *redis.ClusterClient splits into one per node, sent at
// once: one round trip per node, not per key (per maxPipeline keys for a
// larger call). An entry whose reply needs
// more than the reply (a key that is not a STRING, a refused write, a
// pending record due a check for a wedge, a resharding, a script the server
// lost twice), and every entry of an operation whose writes are
// acknowledged (WithReplicaAcks), is done by the single-key method instead:
// safe to send again, since each single-key step is reserve-or-read or
// owner-checked, and the reply that sends it there says that it did not run
// or wrote nothing. A Client without a Pipeline method does every entry with
// the single-key method.

var _ idemstore.BulkStore = (*Store)(nil)

// maxSingles bounds the single-key calls that one bulk call runs at once.
// Calls of acknowledged writes that run together share their WAITs (see
// ackQueue).
const maxSingles = 16

// GetMany implements idemstore.BulkStore: records[i] is what Get returns
// for keys[i]. It takes one round trip per node. It returns a
// *coordinator.StorageError of idemevent.MethodGet, and no records, when
// Redis fails.
func (s *Store) GetMany(ctx context.Context, keys []idemstore.Key) ([]idemstore.Record, error) {
	names := s.names(keys)
	recs := make([]idemstore.Record, len(keys))
	err := s.runBulk(ctx, names, bulkOp{
		method: idemevent.MethodGet,
		cmd: func(ctx context.Context, i int) *redis.Cmd {
			if s.format == Format1 { // as Get: legacy.lua reads a HASH or a STRING
				return redis.NewCmd(ctx, argEvalSha, legacyScript.Hash(), argOneKey, names[i])
			}
			return redis.NewCmd(ctx, argGet, names[i])
		},
		read: func(i int, cmd *redis.Cmd) (bool, error) {
			v, err := cmd.Result()
			switch {
			case errors.Is(err, redis.Nil):
				return false, nil
			case s.redo(err):
				return true, nil
			case err != nil:
				return false, err
			}
			recs[i], err = getReply(v)
			return false, err
		},
		single: func(ctx context.Context, i int) (err error) {
			recs[i], err = s.get(ctx, idemevent.MethodGet, names[i], false)
			return err
		},
	})
	if err != nil {
		return nil, err
	}
	return recs, nil
}

// getReply reads the reply of GET (a STRING) or of legacy.lua.
func getReply(v any) (idemstore.Record, error) {
	if n, ok := v.(int64); ok && n == 0 {
		return idemstore.Record{}, nil
	}
	return decodeReply(v)
}

// ReserveMany implements idemstore.BulkStore: entry i is Reserve of
// keys[i] with ws[i]. It takes one round trip per node (one more for each
// repeat of a key), plus what Reserve takes for each entry it does with
// Reserve: those of operations whose writes are acknowledged, and those
// whose reply needs Reserve's follow-up (a key that is not a STRING, a
// refused write, a pending record due a check for a wedge).
//
// With allOrNothing, when an entry did not write, it takes back the entries
// that wrote: a pending record with Release's script, a completed or
// not-replayable one with unwrite.lua, each only while it is the record
// this call wrote (its token); it then reports no entry written, and the
// records that prevented the writes. A take-back runs on ctx without its
// cancellation, for at most releaseTimeout.
//
// It returns a *coordinator.StorageError of idemevent.MethodReserve, and
// sends nothing, when the slices' lengths differ or a write is one Reserve
// refuses; and one when Redis fails, with the outcomes known so far: the
// entries that wrote (with allOrNothing, taken back best effort; written
// still reports them, as they may not have been).
func (s *Store) ReserveMany(ctx context.Context, keys []idemstore.Key, ws []idemstore.Write, allOrNothing bool) ([]idemstore.Record, []bool, error) {
	if len(ws) != len(keys) {
		return nil, nil, storageError(idemevent.MethodReserve,
			fmt.Errorf("redisrepo: ReserveMany of %d keys with %d writes", len(keys), len(ws)))
	}
	r, err := s.newReserves(keys, ws)
	if err != nil {
		return nil, nil, storageError(idemevent.MethodReserve, err)
	}
	err = s.runBulk(ctx, r.names, r.op(s))
	if !allOrNothing || (err == nil && !r.anyRefused()) {
		return r.existing, r.written, err
	}
	tctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), releaseTimeout)
	defer cancel()
	if terr := s.takeBack(tctx, r); terr != nil {
		if err == nil {
			err = storageError(idemevent.MethodReserve,
				fmt.Errorf("redisrepo: take back the writes of an all-or-nothing ReserveMany: %w", terr))
		}
		return r.existing, r.written, err
	}
	clear(r.written)
	return r.existing, r.written, err
}

// reserves is one ReserveMany: its entries, encoded, and their outcomes.
type reserves struct {
	keys     []idemstore.Key
	ws       []idemstore.Write
	names    []string // the Redis keys
	vals     []string // the records to write, in format 2
	ttls     []int64  // the times to live, in milliseconds
	existing []idemstore.Record
	written  []bool
	due      []bool // the pending record met is due a check for a wedge
}

// newReserves checks and encodes the writes of a ReserveMany, as Reserve
// does, and returns an error for the first one that Reserve refuses.
func (s *Store) newReserves(keys []idemstore.Key, ws []idemstore.Write) (*reserves, error) {
	n := len(keys)
	r := &reserves{keys: keys, ws: ws, names: s.names(keys), vals: make([]string, n), ttls: make([]int64, n),
		existing: make([]idemstore.Record, n), written: make([]bool, n), due: make([]bool, n)}
	for i, w := range ws {
		ttl, err := checkWrite(w)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", keys[i], err)
		}
		r.ttls[i] = ttl
		if s.format == Format1 {
			continue
		}
		b, err := encodeRecord(w.State, w.Token, w.Fingerprint, w.Result)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", keys[i], err)
		}
		r.vals[i] = string(b)
	}
	return r, nil
}

// anyRefused reports whether an entry did not write.
func (r *reserves) anyRefused() bool {
	for _, ok := range r.written {
		if !ok {
			return true
		}
	}
	return false
}

// op returns the bulk steps of r: the commands Reserve sends (SET NX PX GET,
// reserve.lua for a Replace, reserve1.lua in format 1), and Reserve itself
// for the entries of acknowledged operations and those a reply sends there.
func (r *reserves) op(s *Store) bulkOp {
	return bulkOp{
		method: idemevent.MethodReserve,
		cmd: func(ctx context.Context, i int) *redis.Cmd {
			w, name := r.ws[i], r.names[i]
			switch {
			case s.acking(r.keys[i].Operation):
				return nil
			case s.format == Format1:
				return redis.NewCmd(ctx, append([]any{argEvalSha, reserve1Script.Hash(), argOneKey, name}, reserve1Args(w, r.ttls[i])...)...)
			case w.Replace:
				return redis.NewCmd(ctx, argEvalSha, reserveScript.Hash(), argOneKey, name,
					r.vals[i], r.ttls[i], storedToken(w.ReplaceToken), w.ReplaceToken)
			}
			return redis.NewCmd(ctx, argSet, name, r.vals[i], argNX, argPX, r.ttls[i], argGet)
		},
		read: func(i int, cmd *redis.Cmd) (bool, error) {
			return r.read(s, i, cmd)
		},
		single: func(ctx context.Context, i int) (err error) {
			if r.due[i] {
				c := &command{key: r.names[i], val: r.vals[i]}
				r.existing[i], r.written[i], err = s.abandon(ctx, c, r.existing[i], r.ws[i], r.ttls[i])
				return err
			}
			r.existing[i], r.written[i], err = s.Reserve(ctx, r.keys[i], r.ws[i])
			return err
		},
	}
}

// read reads the reply of entry i's command as Reserve does. A pending
// record that is due a check for a wedge (see sightings) is left to the
// single-key step, which checks it with abandon.lua.
func (r *reserves) read(s *Store, i int, cmd *redis.Cmd) (bool, error) {
	plain := s.format == Format2 && !r.ws[i].Replace
	v, err := cmd.Result()
	switch {
	case plain && errors.Is(err, redis.Nil):
		r.written[i] = true
		return false, nil
	case s.redo(err):
		return true, nil
	case err != nil:
		return false, err
	}
	if n, ok := v.(int64); ok && n == 1 && !plain { // the scripts' "written"
		r.written[i] = true
		return false, nil
	}
	rec, err := decodeReply(v)
	if err != nil {
		return false, err
	}
	r.existing[i] = rec
	if plain && rec.State == idemstore.StatePending && s.seen.due(r.names[i], rec.Token, checkEvery(r.ws[i])) {
		r.due[i] = true
		return true, nil
	}
	return false, nil
}

// takeBack deletes, owner-checked, the records that r's entries wrote (see
// ReserveMany). It returns the first error.
func (s *Store) takeBack(ctx context.Context, r *reserves) error {
	var at []int // the entries to take back
	var names []string
	for i, ok := range r.written {
		if ok {
			at = append(at, i)
			names = append(names, r.names[i])
		}
	}
	done := make([]bool, len(at))
	return s.runBulk(ctx, names, bulkOp{
		method: idemevent.MethodRelease,
		cmd: func(ctx context.Context, j int) *redis.Cmd {
			w, name := r.ws[at[j]], names[j]
			switch {
			case w.State != idemstore.StatePending:
				return redis.NewCmd(ctx, argEvalSha, unwriteScript.Hash(), argOneKey, name, storedToken(w.Token), w.Token)
			case s.format == Format1:
				return redis.NewCmd(ctx, argEvalSha, owner1Script.Hash(), argOneKey, name, "release", w.Token, "", 0)
			}
			return redis.NewCmd(ctx, argEvalSha, releaseScript.sha, argOneKey, name,
				storedToken(w.Token), s.wakeChannel(name), s.publishArg())
		},
		read: s.ownerRead(done),
		single: func(ctx context.Context, j int) (err error) {
			i := at[j]
			if r.ws[i].State == idemstore.StatePending {
				done[j], err = s.Release(ctx, r.keys[i], r.ws[i].Token)
				return err
			}
			v, err := unwriteScript.Run(ctx, s.client, []string{names[j]}, storedToken(r.ws[i].Token), r.ws[i].Token).Result()
			done[j], err = ownerReply(idemevent.MethodRelease, v, err)
			return err
		},
	})
}

// CompleteMany implements idemstore.BulkStore: ok[i] is what Complete of
// keys[i] with tokens[i] and cs[i] reports, and each completion wakes the
// key's waiters as Complete does. It takes one round trip per node (one
// more for each repeat of a key), plus what Complete takes for each entry
// of an operation whose writes are acknowledged, which it does with
// Complete.
//
// It returns a *coordinator.StorageError of idemevent.MethodComplete, and
// sends nothing, when the slices' lengths differ or a completion is one
// Complete refuses; and one when Redis fails, with the entries known to
// have completed so far.
func (s *Store) CompleteMany(ctx context.Context, keys []idemstore.Key, tokens []string, cs []idemstore.Completion) ([]bool, error) {
	if len(tokens) != len(keys) || len(cs) != len(keys) {
		return nil, storageError(idemevent.MethodComplete,
			fmt.Errorf("redisrepo: CompleteMany of %d keys with %d tokens and %d completions", len(keys), len(tokens), len(cs)))
	}
	ttls := make([]int64, len(cs))
	for i, c := range cs {
		ms, err := millis(c.TTL)
		if err == nil {
			_, _, err = completionStates(c.State)
		}
		if err != nil {
			return nil, storageError(idemevent.MethodComplete, fmt.Errorf("%s: %w", keys[i], err))
		}
		ttls[i] = ms
	}
	names := s.names(keys)
	ok := make([]bool, len(keys))
	err := s.runBulk(ctx, names, bulkOp{
		method: idemevent.MethodComplete,
		cmd: func(ctx context.Context, i int) *redis.Cmd {
			if s.acking(keys[i].Operation) {
				return nil
			}
			state, state1, _ := completionStates(cs[i].State) // checked above
			if s.format == Format1 {
				return redis.NewCmd(ctx, argEvalSha, owner1Script.Hash(), argOneKey, names[i],
					"complete", tokens[i], cs[i].Result, ttls[i], state1)
			}
			return redis.NewCmd(ctx, argEvalSha, completeScript.sha, argOneKey, names[i], storedToken(tokens[i]),
				cs[i].Result, ttls[i], s.wakeChannel(names[i]), state, s.publishArg())
		},
		read: s.ownerRead(ok),
		single: func(ctx context.Context, i int) (err error) {
			ok[i], err = s.Complete(ctx, keys[i], tokens[i], cs[i])
			return err
		},
	})
	return ok, err
}

// DeleteMany implements idemstore.BulkStore: it is Forget, and returns a
// *coordinator.StorageError of idemevent.MethodRelease when Redis fails,
// with the number of keys deleted by the batches that went through.
func (s *Store) DeleteMany(ctx context.Context, keys []idemstore.Key) (int, error) {
	n, err := s.Forget(ctx, keys...)
	if err != nil {
		return n, storageError(idemevent.MethodRelease, err)
	}
	return n, nil
}

// names returns the Redis keys of keys.
func (s *Store) names(keys []idemstore.Key) []string {
	names := make([]string, len(keys))
	for i, k := range keys {
		names[i] = s.Key(k)
	}
	return names
}

// ownerRead returns the reader of the replies of an owner script (see
// ownerReply), which sets ok[i].
func (s *Store) ownerRead(ok []bool) func(i int, cmd *redis.Cmd) (bool, error) {
	return func(i int, cmd *redis.Cmd) (bool, error) {
		v, err := cmd.Result()
		if s.redo(err) {
			return true, nil
		}
		if err != nil {
			return false, err
		}
		n, isInt := v.(int64)
		if !isInt || (n != 0 && n != 1) {
			return false, fmt.Errorf("redisrepo: unexpected script reply %T %v", v, v)
		}
		ok[i] = n == 1
		return false, nil
	}
}

// A bulkOp is the steps of one bulk call, entry by entry.
type bulkOp struct {
	// method is the method named by the call's storage errors.
	method idemevent.Method
	// cmd returns the command that entry i sends in the call's pipeline,
	// or nil when single does entry i.
	cmd func(ctx context.Context, i int) *redis.Cmd
	// read reads the reply to entry i's command, and reports true when
	// single must do the entry (see redo). Its error fails the call.
	read func(i int, cmd *redis.Cmd) (again bool, err error)
	// single does entry i with the single-key method; its error, a
	// *coordinator.StorageError, fails the call.
	single func(ctx context.Context, i int) error
}

// runBulk runs op on the entries whose Redis keys are names, wave by wave
// (see waves): a wave's commands in one pipeline, then its entries that
// single does, maxSingles at a time. It returns the first error once its
// wave is done; the waves after it are not sent. The entries of a wave
// whose own replies came all go on when another entry's command failed
// (on a cluster, another node timed out): each is decided by what Redis
// answered for it, so that one node's outage is not reported for a key
// whose node answered, which would run its action unprotected.
func (s *Store) runBulk(ctx context.Context, names []string, op bulkOp) error {
	p, pipelines := s.client.(pipeliner)
	for _, wave := range waves(names) {
		var piped, singles []int
		var cmds []*redis.Cmd
		for _, i := range wave {
			var cmd *redis.Cmd
			if pipelines {
				cmd = op.cmd(ctx, i)
			}
			if cmd == nil {
				singles = append(singles, i)
				continue
			}
			piped = append(piped, i)
			cmds = append(cmds, cmd)
		}
		s.pipeline(ctx, p, cmds)
		var first error
		for j, i := range piped {
			again, err := op.read(i, cmds[j])
			if err != nil {
				first = graver(first, storageError(op.method, err))
			}
			if again {
				singles = append(singles, i)
			}
		}
		if first = graver(first, eachSingle(ctx, singles, op.single)); first != nil {
			return first
		}
	}
	return nil
}

// waves splits the entries of a bulk call, whose Redis keys are names, into
// waves in which each key appears once: entry i is in wave n when n entries
// before it have its key. The waves run one after the other, so that the
// entries of one key are decided in order; a call without a key given twice
// is one wave.
func waves(names []string) [][]int {
	seen := make(map[string]int, len(names))
	var ws [][]int
	for i, name := range names {
		n := seen[name]
		seen[name] = n + 1
		if n == len(ws) {
			ws = append(ws, make([]int, 0, len(names)-i))
		}
		ws[n] = append(ws[n], i)
	}
	return ws
}

// redo reports whether err, the reply to a command of a bulk call, says
// that the command did not run, or wrote nothing, and that the single-key
// method must do the entry, with the follow-up it makes after such a reply:
// WRONGTYPE (a format 1 HASH, or something unreadable: legacy.lua), a
// refused write (see writeRefused: a read instead), NOSCRIPT (sent whole
// with EVAL), an old server's syntax error (the single-key method says what
// it needs), or a resharding reply or a refused connection on a cluster
// (see rideThrough).
func (s *Store) redo(err error) bool {
	return err != nil && !errors.Is(err, redis.Nil) &&
		(isReplyError(err, "WRONGTYPE") || writeRefused(err) || isNoScript(err) ||
			isReplyError(err, "ERR syntax error") || clusterRetry(s.client, err))
}

// graver returns the error a bulk call reports of two that its entries
// met (either may be nil): a refusal (coordinator.ErrMisconfigured) over
// any other, else the first. The call's error goes to every entry whose
// outcome it leaves unknown, and an outage's error would let mode run run
// them unprotected while Redis refused one of them: with the refusal, none
// runs.
func graver(first, err error) error {
	if first == nil || err != nil && errors.Is(err, coordinator.ErrMisconfigured) && !errors.Is(first, coordinator.ErrMisconfigured) {
		return err
	}
	return first
}

// eachSingle runs fn for each of entries, at most maxSingles at once, and
// returns the error graver picks of theirs. The entries are of one wave: of distinct keys,
// whose order does not matter.
func eachSingle(ctx context.Context, entries []int, fn func(ctx context.Context, i int) error) error {
	if len(entries) == 1 {
		return fn(ctx, entries[0])
	}
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		first error
	)
	sem := make(chan struct{}, maxSingles)
	for _, i := range entries {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			if err := fn(ctx, i); err != nil {
				mu.Lock()
				first = graver(first, err)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return first
}
