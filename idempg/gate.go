package idempg

import (
	"context"
	"sync"
	"time"

	"github.com/idemkit/idempotency/coordinator/idemstore"

	"github.com/idemkit/idempotency/coordinator"
)

// gates lets one caller of this process at a time claim a key, and hold it
// until its transaction ends. The others wait here, holding no connection:
// without it, every waiter of a key that a long (or hung) transaction holds
// would take a connection of the pool to wait on the row's lock, and could
// take them all, starving every other key. Across processes each process's
// one claimer waits on the lock.
type gates struct {
	mu sync.Mutex
	m  map[idemstore.Key]chan struct{} // closed when the key's claimer leaves
}

// enter waits until no other caller of this process claims or holds key,
// and returns leave, which the caller calls once when it is done with the
// key. A caller that had to wait reads the record first, without the gate:
// when the key is settled (a record that a claim for w would not take
// over), it returns that record with settled true and no gate. It returns
// a *coordinator.InProgressError when until passes first, and ctx's error
// when ctx ends.
func (g *gates) enter(ctx context.Context, s *Store, key idemstore.Key, w idemstore.Write, until time.Time) (leave func(), rec idemstore.Record, settled bool, err error) {
	for waited := false; ; waited = true {
		if waited {
			if rec, err = s.Get(ctx, key); err != nil {
				return nil, idemstore.Record{}, false, err
			}
			if !takeable(rec, w) {
				return nil, rec, true, nil
			}
		}
		g.mu.Lock()
		busy, ok := g.m[key]
		if !ok {
			if g.m == nil {
				g.m = make(map[idemstore.Key]chan struct{})
			}
			free := make(chan struct{})
			g.m[key] = free
			g.mu.Unlock()
			return func() {
				g.mu.Lock()
				delete(g.m, key)
				g.mu.Unlock()
				close(free)
			}, idemstore.Record{}, false, nil
		}
		g.mu.Unlock()
		wait := time.Until(until)
		if wait <= 0 {
			return nil, idemstore.Record{}, false, &coordinator.InProgressError{Operation: key.Operation, Key: key.Key, RetryAfter: time.Second}
		}
		t := time.NewTimer(wait)
		select {
		case <-busy:
			t.Stop()
		case <-t.C:
			return nil, idemstore.Record{}, false, &coordinator.InProgressError{Operation: key.Operation, Key: key.Key, RetryAfter: time.Second}
		case <-ctx.Done():
			t.Stop()
			return nil, idemstore.Record{}, false, ctx.Err()
		}
	}
}
