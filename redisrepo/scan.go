package redisrepo

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/idemkit/idempotency/coordinator/idemstore"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idempotency/coordinator"
)

// scanCount is the COUNT hint of every SCAN: how many slots of the keyspace
// one call walks. Redis's default, 10, would make a walk over millions of
// keys take hundreds of thousands of round trips.
const scanCount = 1000

// ScanKeys calls fn with the keys of every record of operation under the
// Store's prefix, a batch at a time (a batch is the keys of one SCAN reply,
// up to about a thousand). It walks the keyspace with SCAN, matching
// prefix + operation + ":*" with the glob characters of the prefix and the
// operation escaped, on the server or, on Redis Cluster, on every master;
// calls to fn never overlap. A Redis key under that pattern whose rest is
// not a valid idempotency key (see coordinator.ValidateKey) is not a record
// and is skipped.
//
// SCAN gives no snapshot: a record written during the walk may be missed,
// and one may be reported twice (while Redis rehashes), never a record that
// was there all along left out. On Redis Cluster a record that moves from a
// master not yet walked to one already walked would be left out, so the
// walk fails instead when the cluster's slots move: a slot migrating or
// importing on a master as its walk begins or ends, a slot map that differs
// after the walk from before it (a resharding, a failover), a slot without
// a master. A master that cannot be reached fails the walk too; no master's
// share is ever left out without an error. fn may have been called before
// such an error. Deleting the keys of a batch in fn (Forget) is safe. The
// walk stops at the first error fn returns, which ScanKeys returns as it
// is.
//
// It returns an error wrapping a *coordinator.InvalidRequestError when
// operation is not valid (coordinator.ValidateOperation), an error when a
// call to Redis fails or a cluster's slots move (run it again), and an
// error when the Store's client is none of *redis.Client,
// *redis.ClusterClient and *redis.Ring: a wrapper cannot be told to walk
// every node.
func (s *Store) ScanKeys(ctx context.Context, operation string, fn func(keys []idemstore.Key) error) error {
	if err := coordinator.ValidateOperation(operation); err != nil {
		return fmt.Errorf("redisrepo: scan: %w", err)
	}
	opPrefix := s.prefix + operation + ":"
	var mu sync.Mutex // ForEachMaster walks the masters at once
	var fnErr error   // fn's, which ends every walk
	err := s.scan(ctx, escapeGlob(opPrefix)+"*", func(names []string) error {
		keys := make([]idemstore.Key, 0, len(names))
		for _, name := range names {
			if op, key, ok := s.parseKey(name); ok && op == operation {
				keys = append(keys, idemstore.Key{Operation: op, Key: key})
			}
		}
		if len(keys) == 0 {
			return nil
		}
		mu.Lock()
		defer mu.Unlock()
		if fnErr != nil { // another master's walk has failed
			return fnErr
		}
		fnErr = fn(keys)
		return fnErr
	})
	if fnErr != nil {
		return fnErr
	}
	if err != nil {
		return fmt.Errorf("redisrepo: scan: %w", err)
	}
	return nil
}

// Counts is how many records of one operation Store.Count found, by state.
type Counts struct {
	// Pending is the number of records in flight: a caller holds the key.
	Pending int
	// Completed is the number of completed records: with a stored result,
	// or not replayable.
	Completed int
	// NotReplayable is how many of Completed are not replayable: the action
	// completed but its result could not be kept.
	NotReplayable int
	// Unreadable is the number of values under the operation's keys that
	// are no record this package reads (another Redis type, another
	// format); the coordinator replaces each at its key's next call.
	Unreadable int
	// Format1 is how many of Pending and Completed are format 1 records
	// (the HASH of releases before format 2): 0 once a rollout to format 2
	// is over and their TTLs have run out.
	Format1 int
}

// Total returns the number of records counted: Pending + Completed +
// Unreadable (Format1 is a part of the first two, NotReplayable of
// Completed).
func (c Counts) Total() int { return c.Pending + c.Completed + c.Unreadable }

// Count counts the records under the Store's prefix by operation and state.
// With operations it counts those only, each in the map even without a
// record; without, every operation that has a record. It walks the keyspace
// as ScanKeys does, reading each record's state but never its result, so the
// counts are no snapshot; with an empty prefix, or one that other data
// shares, keys that only look like records are counted too.
//
// It returns the errors of ScanKeys, and one wrapping a
// *coordinator.InvalidRequestError when an operation is not valid.
func (s *Store) Count(ctx context.Context, operations ...string) (map[string]Counts, error) {
	counts := make(map[string]Counts)
	wanted := make(map[string]bool, len(operations)) // read on several goroutines: never written after this
	for _, op := range operations {
		if err := coordinator.ValidateOperation(op); err != nil {
			return nil, fmt.Errorf("redisrepo: count: %w", err)
		}
		counts[op] = Counts{}
		wanted[op] = true
	}
	match := escapeGlob(s.prefix) + "*"
	if len(operations) == 1 {
		match = escapeGlob(s.prefix+operations[0]+":") + "*"
	}
	p, ok := s.client.(pipeliner)
	if !ok {
		return nil, fmt.Errorf("redisrepo: count: a %T cannot be walked: want a *redis.Client, *redis.ClusterClient or *redis.Ring", s.client)
	}
	var mu sync.Mutex
	err := s.scan(ctx, match, func(names []string) error {
		var ops []string
		var kept []string
		for _, name := range names {
			op, _, ok := s.parseKey(name)
			if !ok {
				continue
			}
			if len(wanted) > 0 && !wanted[op] {
				continue
			}
			ops = append(ops, op)
			kept = append(kept, name)
		}
		if len(kept) == 0 {
			return nil
		}
		states, err := readStates(ctx, p, kept)
		if err != nil {
			return err
		}
		mu.Lock()
		defer mu.Unlock()
		for i, st := range states {
			c := counts[ops[i]]
			switch st.state {
			case idemstore.StateAbsent: // gone since SCAN saw it
				continue
			case idemstore.StatePending:
				c.Pending++
			case idemstore.StateCompleted:
				c.Completed++
			case idemstore.StateNotReplayable:
				c.Completed++
				c.NotReplayable++
			default:
				c.Unreadable++
			}
			if st.format1 {
				c.Format1++
			}
			counts[ops[i]] = c
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("redisrepo: count: %w", err)
	}
	return counts, nil
}

// keyState is the state of one record as Count reads it.
type keyState struct {
	state   idemstore.State
	format1 bool
}

// readStates returns the states of the records under names, in their order,
// as the Store's readers judge them (decodeValue, and record.lua's load for
// format 1), without reading a result: the header and the length of a
// format 2 record (GETRANGE 0 5, STRLEN), and the fields of a HASH but its
// result (HMGET, HEXISTS). Two pipelines at most: the second for the HASHes
// and the empty replies, with EXISTS, for a key gone since SCAN saw it is
// StateAbsent (and an empty STRING is unreadable). The pipeline of
// a ClusterClient sends each command to the master of its slot and follows
// redirections.
func readStates(ctx context.Context, p pipeliner, names []string) ([]keyState, error) {
	states := make([]keyState, len(names))
	pipe := p.Pipeline()
	heads := make([]*redis.StringCmd, len(names))
	lens := make([]*redis.IntCmd, len(names))
	for i, name := range names {
		heads[i] = pipe.GetRange(ctx, name, 0, headerLen-1)
		lens[i] = pipe.StrLen(ctx, name)
	}
	execPipeline(ctx, pipe)

	type second struct {
		at     int
		fields *redis.SliceCmd // a HASH: v, state, token, fp
		result *redis.BoolCmd  // a HASH: whether it has a result
		exists *redis.IntCmd   // whether it is there at all
	}
	var again []second
	pipe = p.Pipeline()
	for i, cmd := range heads {
		head, err := cmd.Result()
		switch {
		case isReplyError(err, "WRONGTYPE"):
			again = append(again, second{
				at:     i,
				fields: pipe.HMGet(ctx, names[i], "v", "state", "token", "fp"),
				result: pipe.HExists(ctx, names[i], "result"),
				exists: pipe.Exists(ctx, names[i]),
			})
			continue
		case err != nil:
			return nil, replyError(err)
		case head == "":
			again = append(again, second{at: i, exists: pipe.Exists(ctx, names[i])})
			continue
		}
		n, err := lens[i].Result()
		if err != nil {
			return nil, replyError(err)
		}
		states[i].state = headerState(head, n)
	}
	if len(again) == 0 {
		return states, nil
	}
	execPipeline(ctx, pipe)
	for _, a := range again {
		n, err := a.exists.Result()
		switch {
		case err != nil:
			return nil, replyError(err)
		case n == 0: // gone since SCAN saw it
			continue
		case a.fields == nil: // an empty STRING
			states[a.at].state = idemstore.StateUnreadable
			continue
		}
		f, err := a.fields.Result()
		if isReplyError(err, "WRONGTYPE") { // a list, a set, ...
			states[a.at].state = idemstore.StateUnreadable
			continue
		}
		if err != nil {
			return nil, replyError(err)
		}
		hasResult, err := a.result.Result()
		if err != nil && !isReplyError(err, "WRONGTYPE") {
			return nil, replyError(err)
		}
		states[a.at] = keyState{state: legacyState(f, hasResult), format1: true}
	}
	for i := range states {
		if states[i].state == idemstore.StateUnreadable {
			states[i].format1 = false
		}
	}
	return states, nil
}

// headerState judges a STRING from its first headerLen bytes, head, and its
// length n, as decodeValue does from the whole value.
func headerState(head string, n int64) idemstore.State {
	if len(head) < headerLen || head[0] != formatVersion {
		return idemstore.StateUnreadable
	}
	st := head[1]
	end := int64(headerLen) + int64(head[3]) + (int64(head[4])<<8 | int64(head[5]))
	if n < end || !knownState(st) || (st == statePending && n != end) {
		return idemstore.StateUnreadable
	}
	return idemstore.State(st)
}

// legacyState judges a HASH from its fields v, state, token and fp (the
// reply of HMGET, nil for a missing field) and whether it has a result, as
// record.lua's load does.
func legacyState(f []any, hasResult bool) idemstore.State {
	if len(f) != 4 || f[0] != legacyVersion || f[2] == nil || f[3] == nil {
		return idemstore.StateUnreadable
	}
	switch {
	case f[1] == "pending":
		return idemstore.StatePending
	case f[1] == "completed" && hasResult:
		return idemstore.StateCompleted
	case f[1] == argNotReplayable && hasResult:
		return idemstore.StateNotReplayable
	}
	return idemstore.StateUnreadable
}

// scan calls fn with the names of the keys that match the glob pattern
// match, one SCAN reply at a time, on every node that holds a share of the
// keys: the server of a *redis.Client, every master of a
// *redis.ClusterClient (at once, each on a goroutine of ForEachMaster's),
// every shard of a *redis.Ring. fn may be called on several goroutines at
// once. The walk stops at the first error, on every node.
func (s *Store) scan(ctx context.Context, match string, fn func(names []string) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var mu sync.Mutex
	var first error // the cause: the walks that it cancels fail with context.Canceled
	_, single := s.client.(*redis.Client)
	walk := func(ctx context.Context, node *redis.Client) error {
		err := scanNode(ctx, node, match, !single, fn)
		if err != nil {
			mu.Lock()
			if first == nil {
				first = err
			}
			mu.Unlock()
			cancel()
		}
		return err
	}
	var err error
	switch c := s.client.(type) {
	case *redis.Client:
		err = walk(ctx, c)
	case *redis.ClusterClient:
		err = scanCluster(ctx, c, walk)
	case *redis.Ring:
		err = c.ForEachShard(ctx, walk)
	default:
		return fmt.Errorf("a %T cannot be walked: want a *redis.Client, *redis.ClusterClient or *redis.Ring", s.client)
	}
	mu.Lock()
	defer mu.Unlock()
	if first != nil {
		return first
	}
	return replyError(err)
}

// scanCluster walks every master of c with walk, and returns an error when
// the walk may have missed keys because the cluster's slots moved: when a
// slot is migrating or importing on a master as its walk begins or ends,
// when the slot map (which master serves which slots, CLUSTER SHARDS)
// differs after the walk from before it, when a slot has no master, or when
// the masters walked are not those that serve the slots. A key that moves
// from a master not yet walked to one already walked would otherwise be
// left out without a word. A master that cannot be reached fails its walk.
func scanCluster(ctx context.Context, c *redis.ClusterClient, walk func(context.Context, *redis.Client) error) error {
	before, err := slotMap(ctx, c)
	if err != nil {
		return err
	}
	var mu sync.Mutex
	walked := map[string]bool{}
	err = c.ForEachMaster(ctx, func(ctx context.Context, node *redis.Client) error {
		id, err := stableMaster(ctx, node)
		if err != nil {
			return err
		}
		mu.Lock()
		walked[id] = true
		mu.Unlock()
		if err := walk(ctx, node); err != nil {
			return err
		}
		_, err = stableMaster(ctx, node)
		return err
	})
	if err != nil {
		return err
	}
	after, err := slotMap(ctx, c)
	if err != nil {
		return err
	}
	if after.layout != before.layout {
		return errors.New("the cluster's slots moved during the walk (resharding or failover), so keys may have been missed: run it again")
	}
	for id := range before.masters {
		if !walked[id] {
			return fmt.Errorf("master %s serves slots but was not walked (the client's view of the cluster is stale): run it again", id)
		}
	}
	return nil
}

// clusterSlots is a cluster's slot map, as CLUSTER SHARDS gives it.
type clusterSlots struct {
	layout  string          // "start-end:master-id ..." in slot order
	masters map[string]bool // the ids of the masters that serve slots
}

// clusterSlotCount is the number of hash slots of a Redis Cluster.
const clusterSlotCount = 16384

// slotMap reads the slot map of c (CLUSTER SHARDS, Redis 7.0, which the
// Store needs anyway), and returns an error when a slot has no master.
func slotMap(ctx context.Context, c *redis.ClusterClient) (clusterSlots, error) {
	shards, err := c.ClusterShards(ctx).Result()
	if err != nil {
		return clusterSlots{}, fmt.Errorf("cluster shards: %w", replyError(err))
	}
	type slotRange struct {
		start, end int64
		master     string
	}
	var ranges []slotRange
	out := clusterSlots{masters: map[string]bool{}}
	var served int64
	for _, sh := range shards {
		if len(sh.Slots) == 0 {
			continue // a master without slots (or its replicas): no keys of its own
		}
		master := ""
		for _, n := range sh.Nodes {
			if n.Role == "master" && n.ID != "" {
				master = n.ID
				break
			}
		}
		if master == "" {
			return clusterSlots{}, fmt.Errorf("cluster shards: slots %d-%d have no master", sh.Slots[0].Start, sh.Slots[0].End)
		}
		out.masters[master] = true
		for _, sr := range sh.Slots {
			ranges = append(ranges, slotRange{sr.Start, sr.End, master})
			served += sr.End - sr.Start + 1
		}
	}
	if served != clusterSlotCount {
		return clusterSlots{}, fmt.Errorf("cluster shards: %d of %d slots have a master, so keys could be missed", served, clusterSlotCount)
	}
	slices.SortFunc(ranges, func(a, b slotRange) int { return int(a.start - b.start) })
	var b strings.Builder
	for _, r := range ranges {
		fmt.Fprintf(&b, "%d-%d:%s ", r.start, r.end, r.master)
	}
	out.layout = b.String()
	return out, nil
}

// stableMaster returns the id of the cluster node of c, from its own line
// of CLUSTER NODES, and an error when it is not a master or has a slot
// migrating to or importing from another node (a resharding in progress:
// its keys are moving).
func stableMaster(ctx context.Context, c *redis.Client) (string, error) {
	nodes, err := c.ClusterNodes(ctx).Result()
	if err != nil {
		return "", fmt.Errorf("%s: cluster nodes: %w", c.Options().Addr, replyError(err))
	}
	for line := range strings.SplitSeq(nodes, "\n") {
		f := strings.Fields(line)
		if len(f) < 8 || !slices.Contains(strings.Split(f[2], ","), "myself") {
			continue
		}
		if !slices.Contains(strings.Split(f[2], ","), "master") {
			return "", fmt.Errorf("%s is no longer a master (a failover): run it again", c.Options().Addr)
		}
		for _, slot := range f[8:] {
			// [slot->-id]: migrating to id; [slot-<-id]: importing from id.
			m, ok := strings.CutPrefix(slot, "[")
			if !ok {
				continue
			}
			m = strings.TrimSuffix(m, "]")
			if n, id, ok := strings.Cut(m, "->-"); ok {
				m = n + " migrating to node " + id
			} else if n, id, ok := strings.Cut(m, "-<-"); ok {
				m = n + " importing from node " + id
			}
			return "", fmt.Errorf("%s has slot %s (a resharding in progress): keys could be missed while they move; run it again when it is over",
				c.Options().Addr, m)
		}
		return f[0], nil
	}
	return "", fmt.Errorf("%s: cluster nodes: no line for the node itself", c.Options().Addr)
}

// scanNode walks the keys of one server that match match, with SCAN. Its
// errors name the node's address when named is set: one node of several.
// (A single client's caller knows where it points, and a failover client's
// address is go-redis's "FailoverClient".)
func scanNode(ctx context.Context, node *redis.Client, match string, named bool, fn func(names []string) error) error {
	var cursor uint64
	for {
		names, next, err := node.Scan(ctx, cursor, match, scanCount).Result()
		if err != nil && named {
			return fmt.Errorf("%s: %w", node.Options().Addr, replyError(err))
		}
		if err != nil {
			return replyError(err)
		}
		if len(names) > 0 {
			if err := fn(names); err != nil {
				return err
			}
		}
		if next == 0 {
			return nil
		}
		cursor = next
	}
}

// parseKey splits name, the name of a Redis key, into the operation and the
// key of the record it holds: name is prefix + operation + ":" + key, and an
// operation cannot hold a colon (coordinator.ValidateOperation), so the
// first colon after the prefix ends it; the key may hold more. It reports
// false for a name that is not under the prefix, or whose operation or key
// is not valid.
func (s *Store) parseKey(name string) (operation, key string, ok bool) {
	rest, ok := strings.CutPrefix(name, s.prefix)
	if !ok {
		return "", "", false
	}
	operation, key, ok = strings.Cut(rest, ":")
	if !ok || coordinator.ValidateOperation(operation) != nil || coordinator.ValidateKey(key) != nil {
		return "", "", false
	}
	return operation, key, true
}

// escapeGlob escapes the characters that a Redis glob pattern (SCAN's MATCH,
// KEYS) gives a meaning, so that the pattern matches s literally: *, ?, [,
// ] and the backslash itself. Redis reads a backslash as "the next
// character, literally" everywhere in a pattern.
func escapeGlob(s string) string {
	if !strings.ContainsAny(s, `*?[]\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case '*', '?', '[', ']', '\\':
			b.WriteByte('\\')
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
