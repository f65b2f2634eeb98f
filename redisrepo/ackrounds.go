package redisrepo

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idempotency/coordinator"
)

// An ackRound is the acknowledgement of the writes queued on one master
// while its previous round was out: their touches and one WAIT (WAITAOF),
// pipelined on one connection. A round covers exactly the writes whose
// touch it sends, so one that is out covers none queued after it.
//
// One round at a time per master is what keeps a replica that stops
// acknowledging from starving the client's pool: without rounds every write
// held a connection for its whole WAIT, and a stalled replica (or the
// seconds of a failover) held every connection of the pool, so that the
// completions of actions that had run, and the renewals that keep their
// reservations, queued behind new reservations that could not be
// acknowledged anyway, until their records expired (docs/reliability.md,
// "Replica acknowledgement"). Under load a round also acknowledges many
// writes with one WAIT.
type ackQueue struct {
	node *redis.Client

	mu      sync.Mutex
	queued  []*ackWrite
	running bool // a round is out, and its goroutine takes the next
}

// An ackWrite is one write waiting to be acknowledged: its touch, the end of
// its budget, and its outcome once done is closed.
type ackWrite struct {
	touch *redis.Cmd
	until time.Time
	done  chan struct{}
	acked bool  // the touch found the record and enough replicas acknowledged it
	err   error // the round's failure, or ErrNotAcknowledged
	// offPath is the write's context when no caller waits for it
	// (coordinator.OffRequestPath: a completion retried in the
	// background), so that the round carrying it is not refused as on
	// the request path (the module's circuit breaker); nil otherwise.
	offPath context.Context
}

// ackQueue returns the queue of node, the master of a record.
func (s *Store) ackQueue(node *redis.Client) *ackQueue {
	addr := node.Options().Addr
	s.ackMu.Lock()
	defer s.ackMu.Unlock()
	q := s.ackQueues[addr]
	if q == nil || q.node != node {
		q = &ackQueue{node: node}
		s.ackQueues[addr] = q
	}
	return q
}

// wait has w acknowledged: when no round is out, in a round of its own that
// it sends itself on ctx (as many rounds are at 1 caller: no goroutine, no
// hand-off), then hands the writes queued meanwhile to a goroutine of
// rounds; otherwise it queues w and waits for its round, or for ctx.
func (q *ackQueue) wait(ctx context.Context, s *Store, w *ackWrite) (bool, error) {
	q.mu.Lock()
	if !q.running {
		q.running = true
		q.mu.Unlock()
		s.ackRound(ctx, q.node, []*ackWrite{w})
		q.mu.Lock()
		if len(q.queued) > 0 {
			go q.rounds(s)
		} else {
			q.running = false
		}
		q.mu.Unlock()
		return w.acked, w.err
	}
	if coordinator.OffRequestPath(ctx) {
		w.offPath = ctx
	}
	q.queued = append(q.queued, w)
	q.mu.Unlock()
	select {
	case <-w.done:
		return w.acked, w.err
	case <-ctx.Done():
		return false, fmt.Errorf("%w (%w before its round ended)", ErrNotAcknowledged, ctx.Err())
	}
}

// rounds sends rounds until no write is queued.
func (q *ackQueue) rounds(s *Store) {
	for {
		q.mu.Lock()
		batch := q.queued
		q.queued = nil
		if len(batch) == 0 {
			q.running = false
			q.mu.Unlock()
			return
		}
		q.mu.Unlock()
		s.ackRound(roundContext(batch), q.node, batch)
	}
}

// roundContext is the context of a round that the goroutine of rounds
// sends: off the request path when any of its writes is, so that a client
// that refuses calls to spare a caller's time (the module's circuit
// breaker) lets it through, as it lets that write through alone.
func roundContext(batch []*ackWrite) context.Context {
	for _, w := range batch {
		if w.offPath != nil {
			return context.WithoutCancel(w.offPath)
		}
	}
	return context.Background()
}

// ackReplyMargin is how long a round waits for WAIT's reply after WAIT's own
// timeout.
const ackReplyMargin = 250 * time.Millisecond

// ackRound sends the touches of batch and one WAIT (WAITAOF) for the
// longest budget among the writes still waiting, on parent (bounded by that
// budget and ackReplyMargin), and settles every write.
func (s *Store) ackRound(parent context.Context, node *redis.Client, batch []*ackWrite) {
	now := time.Now()
	live := batch[:0]
	var until time.Time
	for _, w := range batch {
		if !w.until.After(now) { // its caller has given up
			w.err = ErrNotAcknowledged
			close(w.done)
			continue
		}
		live = append(live, w)
		until = later(until, w.until)
	}
	if len(live) == 0 {
		return
	}
	ms := max(until.Sub(now).Milliseconds(), 1)
	ctx, cancel := context.WithDeadline(parent, until.Add(ackReplyMargin))
	defer cancel()
	var wait *redis.Cmd
	unsent(node.Pipelined(ctx, func(p redis.Pipeliner) error {
		for _, w := range live {
			_ = p.Process(ctx, w.touch)
		}
		if s.acks.Fsync {
			wait = p.Do(ctx, "waitaof", 1, s.acks.Replicas, ms)
		} else {
			wait = p.Do(ctx, "wait", s.acks.Replicas, ms)
		}
		return nil
	}))
	enough, werr := s.enoughAcks(wait, time.Duration(ms)*time.Millisecond)
	for _, w := range live {
		switch n, err := w.touch.Int64(); {
		case err != nil:
			w.err = err
		case n != 1: // no record to touch
		case werr != nil:
			w.err = werr
		default:
			w.acked = enough
		}
		close(w.done)
	}
}

// enoughAcks reads WAIT's (WAITAOF's) reply: nil when enough acknowledged,
// an error that matches ErrNotAcknowledged when too few did.
func (s *Store) enoughAcks(wait *redis.Cmd, within time.Duration) (bool, error) {
	within = within.Round(time.Millisecond)
	if s.acks.Fsync {
		v, err := wait.Int64Slice()
		if err != nil {
			return false, err
		}
		if len(v) != 2 {
			return false, fmt.Errorf("redisrepo: WAITAOF replied %v", v)
		}
		if v[0] < 1 || v[1] < int64(s.acks.Replicas) {
			return false, fmt.Errorf("%w (WAITAOF within %v: the master's file %d, %d of %d replicas)", ErrNotAcknowledged, within, v[0], v[1], s.acks.Replicas)
		}
		return true, nil
	}
	n, err := wait.Int64()
	if err != nil {
		return false, err
	}
	if n < int64(s.acks.Replicas) {
		return false, fmt.Errorf("%w (WAIT within %v: %d of %d replicas)", ErrNotAcknowledged, within, n, s.acks.Replicas)
	}
	return true, nil
}

// later returns the later of a and b.
func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}
