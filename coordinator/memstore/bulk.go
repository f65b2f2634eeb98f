package memstore

import (
	"context"
	"fmt"

	"github.com/idemkit/idempotency/coordinator/idemstore"
)

var _ idemstore.BulkStore = (*Store)(nil)

// GetMany implements idemstore.BulkStore: the records under keys, as Get
// reports each.
func (s *Store) GetMany(ctx context.Context, keys []idemstore.Key) ([]idemstore.Record, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	recs := make([]idemstore.Record, len(keys))
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	for i, k := range keys {
		if e, ok := s.lookup(k, now); ok {
			recs[i] = e.out(now)
		}
	}
	return recs, nil
}

// ReserveMany implements idemstore.BulkStore: Reserve for each entry, all
// of them under the Store's lock, so that an all-or-nothing call that
// collides is never seen half written.
func (s *Store) ReserveMany(ctx context.Context, keys []idemstore.Key, ws []idemstore.Write, allOrNothing bool) ([]idemstore.Record, []bool, error) {
	if err := ctx.Err(); err != nil {
		return nil, nil, err
	}
	if len(ws) != len(keys) {
		return nil, nil, fmt.Errorf("memstore: reserve many: %d keys and %d writes", len(keys), len(ws))
	}
	for i, w := range ws {
		if err := checkWrite(keys[i], w); err != nil {
			return nil, nil, err
		}
	}
	existing, written := make([]idemstore.Record, len(keys)), make([]bool, len(keys))
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	all := true
	for i, k := range keys {
		existing[i], _, written[i] = s.reserveLocked(k, ws[i], false, now)
		all = all && written[i]
	}
	if allOrNothing && !all {
		for i := len(keys) - 1; i >= 0; i-- {
			if e, ok := s.lookup(keys[i], now); written[i] && ok && e.rec.Token == ws[i].Token {
				delete(s.records, keys[i])
			}
			written[i] = false
		}
	}
	return existing, written, nil
}

// CompleteMany implements idemstore.BulkStore: Complete for each entry.
func (s *Store) CompleteMany(ctx context.Context, keys []idemstore.Key, tokens []string, cs []idemstore.Completion) ([]bool, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if len(tokens) != len(keys) || len(cs) != len(keys) {
		return nil, fmt.Errorf("memstore: complete many: %d keys, %d tokens and %d completions", len(keys), len(tokens), len(cs))
	}
	for i, c := range cs {
		if !final(c.State) {
			return nil, fmt.Errorf("memstore: complete %s: state is %s, want completed or not_replayable", keys[i], c.State)
		}
		if err := checkTTL("complete", keys[i], c.TTL); err != nil {
			return nil, err
		}
	}
	ok := make([]bool, len(keys))
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	for i, k := range keys {
		ok[i] = s.extendLocked(k, tokens[i], cs[i].TTL, completion(cs[i]), now)
	}
	return ok, nil
}

// DeleteMany implements idemstore.BulkStore: it deletes the live records
// under keys and returns how many there were.
func (s *Store) DeleteMany(ctx context.Context, keys []idemstore.Key) (int, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	n := 0
	for _, k := range keys {
		if _, ok := s.lookup(k, now); ok {
			delete(s.records, k)
			n++
		}
	}
	return n, nil
}
