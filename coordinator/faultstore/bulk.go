package faultstore

import (
	"context"
	"fmt"

	"github.com/idemkit/idempotency/coordinator/idemevent"
	"github.com/idemkit/idempotency/coordinator/idemstore"
)

var _ idemstore.BulkStore = (*Store)(nil)

// The bulk methods: each call counts as one call of its method
// (ReserveMany of idemevent.MethodReserveMany, CompleteMany of
// idemevent.MethodCompleteMany; GetMany, which the coordinator does not
// call, of idemevent.MethodGet, and DeleteMany of
// idemevent.MethodRelease), takes that method's armed failures, and runs its Hook once per entry, in order, before the call: an
// error from any of them fails the whole call. They return an error when the
// inner store is not an idemstore.BulkStore.

// bulk returns the inner store as a BulkStore.
func (s *Store) bulk() (idemstore.BulkStore, error) {
	b, ok := s.inner.(idemstore.BulkStore)
	if !ok {
		return nil, fmt.Errorf("faultstore: the inner store (%T) has no bulk operations", s.inner)
	}
	return b, nil
}

// enterMany is enter for a bulk call of method over keys.
func (s *Store) enterMany(ctx context.Context, method idemevent.Method, keys []idemstore.Key) (lost, err error) {
	if hook := s.count(method); hook != nil {
		for _, k := range keys {
			if err := hook(ctx, k); err != nil {
				return nil, err
			}
		}
	}
	return s.take(method)
}

// GetMany calls the inner store's GetMany unless the call fails before it;
// see the bulk methods above.
func (s *Store) GetMany(ctx context.Context, keys []idemstore.Key) ([]idemstore.Record, error) {
	b, err := s.bulk()
	if err != nil {
		return nil, err
	}
	lost, err := s.enterMany(ctx, idemevent.MethodGet, keys)
	if err != nil {
		return nil, err
	}
	recs, err := b.GetMany(ctx, keys)
	if lost != nil {
		return nil, lost
	}
	return recs, err
}

// ReserveMany calls the inner store's ReserveMany unless the call fails
// before it; see the bulk methods above.
func (s *Store) ReserveMany(ctx context.Context, keys []idemstore.Key, ws []idemstore.Write, allOrNothing bool) ([]idemstore.Record, []bool, error) {
	b, err := s.bulk()
	if err != nil {
		return nil, nil, err
	}
	lost, err := s.enterMany(ctx, idemevent.MethodReserveMany, keys)
	if err != nil {
		return nil, nil, err
	}
	existing, written, err := b.ReserveMany(ctx, keys, ws, allOrNothing)
	if lost != nil {
		return nil, nil, lost
	}
	return existing, written, err
}

// CompleteMany calls the inner store's CompleteMany unless the call fails
// before it; see the bulk methods above.
func (s *Store) CompleteMany(ctx context.Context, keys []idemstore.Key, tokens []string, cs []idemstore.Completion) ([]bool, error) {
	b, err := s.bulk()
	if err != nil {
		return nil, err
	}
	lost, err := s.enterMany(ctx, idemevent.MethodCompleteMany, keys)
	if err != nil {
		return nil, err
	}
	ok, err := b.CompleteMany(ctx, keys, tokens, cs)
	if lost != nil {
		return nil, lost
	}
	return ok, err
}

// DeleteMany calls the inner store's DeleteMany unless the call fails
// before it; see the bulk methods above.
func (s *Store) DeleteMany(ctx context.Context, keys []idemstore.Key) (int, error) {
	b, err := s.bulk()
	if err != nil {
		return 0, err
	}
	lost, err := s.enterMany(ctx, idemevent.MethodRelease, keys)
	if err != nil {
		return 0, err
	}
	n, err := b.DeleteMany(ctx, keys)
	if lost != nil {
		return 0, lost
	}
	return n, err
}
