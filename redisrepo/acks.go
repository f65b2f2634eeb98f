package redisrepo

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/idemkit/idempotency/coordinator/idemevent"
	"github.com/idemkit/idempotency/coordinator/idemstore"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idempotency/coordinator"
)

// ReplicaAcks makes a Store wait, after it writes a reservation or a
// completion, until replicas acknowledge the write (WAIT), and, with Fsync,
// until it is in the append-only files (WAITAOF), so that a failover to a
// replica cannot lose it. Pass it to WithReplicaAcks.
//
// A reservation that is not acknowledged within the call's deadline is
// taken back and returned as a *coordinator.StorageError that matches
// ErrNotAcknowledged: the action does not run under it, and the
// coordinator's on-storage-error mode decides what the call does. A
// completion that is not acknowledged is a storage error too; the
// coordinator sends it again while its reservation lasts, and a completion
// sent again by its owner is acknowledged without being written twice.
//
// Each acknowledged write costs a second round trip: a touch of the record
// (PEXPIRE to its own time to live) and a WAIT, pipelined on one
// connection to its master, since WAIT waits for its own connection's
// writes and replication is in order; plus the replicas' own round trip.
// Writes that wait at the same time share one WAIT per master (an ack
// round), so a replica that stops acknowledging holds one connection. A
// collision or a replay wrote nothing and costs nothing more. Renewals and
// releases are not acknowledged.
type ReplicaAcks struct {
	// Replicas is how many replicas must acknowledge each write: WAIT's
	// numreplicas, and WAITAOF's numreplicas with Fsync. 0 with Fsync waits
	// for the master's own append-only file only.
	Replicas int
	// Fsync waits with WAITAOF instead of WAIT: the master (which must run
	// with appendonly yes) and Replicas replicas have the write in their
	// append-only files. Redis 7.2 or later, or Valkey 8.
	Fsync bool
	// Operations are the operations whose writes are acknowledged; none
	// means every operation.
	Operations []string
}

// ErrNotAcknowledged is matched by the storage error of a write that the
// replicas (or the append-only files) did not acknowledge in time.
var ErrNotAcknowledged = errors.New("redisrepo: the write was not acknowledged by enough replicas in time")

// WithReplicaAcks makes the Store wait for replicas to acknowledge its
// reservations and completions (see ReplicaAcks). The Store's client must
// then be one that CanAcknowledge, or every acknowledged write fails. New
// panics with record format 1, a negative Replicas or an invalid
// operation. A zero ReplicaAcks turns acknowledgement off.
func WithReplicaAcks(a ReplicaAcks) Option {
	return optionFunc(func(s *Store) {
		a.Operations = slices.Clone(a.Operations)
		s.acks = a
	})
}

// acking reports whether the writes of operation are acknowledged.
func (s *Store) acking(operation string) bool {
	return (s.acks.Replicas > 0 || s.acks.Fsync) && (len(s.acks.Operations) == 0 || slices.Contains(s.acks.Operations, operation))
}

// validateAcks checks the ReplicaAcks New applied to s.
func (s *Store) validateAcks() error {
	a := s.acks
	bad := func(err error) error {
		return fmt.Errorf("redisrepo: invalid options: %w", &coordinator.OptionError{Option: "WithReplicaAcks", Err: err})
	}
	switch {
	case a.Replicas < 0:
		return bad(fmt.Errorf("the number of replicas must be 0 or more, got %d", a.Replicas))
	case a.Replicas == 0 && !a.Fsync && len(a.Operations) > 0:
		return bad(errors.New("operations without replicas or Fsync acknowledge nothing"))
	case a.Replicas == 0 && !a.Fsync:
		return nil
	case s.format == Format1:
		return bad(errors.New("record format 1 cannot be acknowledged: its completions cannot be sent again safely"))
	}
	for _, op := range a.Operations {
		if err := coordinator.ValidateOperation(op); err != nil {
			return bad(err)
		}
	}
	return nil
}

// CanAcknowledge reports whether a Store on client can acknowledge its
// writes (WithReplicaAcks): a *redis.Client (a server, or a Sentinel
// failover client) or a *redis.ClusterClient can pipeline the touch and
// its WAIT on one connection to the record's master. With another client (a *redis.Ring, an
// AutoPipeliner), every acknowledged write is a storage error.
func CanAcknowledge(client Client) bool {
	switch client.(type) {
	case *redis.Client, *redis.ClusterClient:
		return true
	}
	return false
}

// ackNode returns the client of the master of rkey, whose pipeline sends
// its commands on one connection (WAIT waits for its own connection's
// writes).
func (s *Store) ackNode(ctx context.Context, rkey string) (*redis.Client, error) {
	switch c := s.client.(type) {
	case *redis.Client:
		return c, nil
	case *redis.ClusterClient:
		return c.MasterForKey(ctx, rkey)
	}
	return nil, fmt.Errorf("redisrepo: a %T cannot acknowledge writes: want a *redis.Client or a *redis.ClusterClient", s.client)
}

// defaultAckWait bounds a WAIT when the call's context has no deadline.
const defaultAckWait = time.Second

// waitBudget is the time a WAIT may take: three quarters of what is left
// before ctx's deadline (the rest is for its reply and for taking a
// reservation back), at least 1ms; defaultAckWait without a deadline.
func waitBudget(ctx context.Context) time.Duration {
	d, ok := ctx.Deadline()
	if !ok {
		return defaultAckWait
	}
	return max(time.Until(d)*3/4, time.Millisecond)
}

// acknowledge has the record under rkey acknowledged: touch, a write that
// follows the record (PEXPIRE to the record's own time to live, or
// confirm.lua), joins the next round of its master (see ackQueue), which
// pipelines it with a WAIT (WAITAOF with Fsync) on one connection. The
// replication stream is in order, so replicas that acknowledge the touch
// have the record. It reports false when touch found no record to touch
// (replied 0), and returns an error that matches ErrNotAcknowledged when
// too few acknowledged within waitBudget. On a cluster it rides through a
// resharding (see rideThrough): a touch that meets MOVED, ASK or TRYAGAIN,
// or a round whose node refuses connections (removed), did not touch the
// record, and is sent again to the slot's master once the slot map is
// reloaded; that master's replicas are the ones that must have it.
func (s *Store) acknowledge(ctx context.Context, rkey string, touch *redis.Cmd) (bool, error) {
	acked, err := s.acknowledgeOnce(ctx, rkey, touch)
	if !clusterRetry(s.client, err) {
		return acked, err
	}
	err = rideThrough(ctx, s.client, err, func() error {
		touch.SetErr(nil)
		var again error
		acked, again = s.acknowledgeOnce(ctx, rkey, touch)
		return again
	})
	return acked, err
}

// acknowledgeOnce is one try of acknowledge, on the master the slot map
// names for rkey now.
func (s *Store) acknowledgeOnce(ctx context.Context, rkey string, touch *redis.Cmd) (bool, error) {
	node, err := s.ackNode(ctx, rkey)
	if err != nil {
		return false, err
	}
	w := &ackWrite{touch: touch, until: time.Now().Add(waitBudget(ctx)), done: make(chan struct{})}
	return s.ackQueue(node).wait(ctx, s, w)
}

// reserveAcked is Reserve with acknowledgement: the reservation as without,
// and, when it wrote, acknowledge. A write that is not acknowledged (or
// that is gone by then) is a storage error, and is taken back when it is a
// pending record: the caller's own reservation, under which nothing runs.
// A collision or a replay wrote nothing, and costs nothing more.
func (s *Store) reserveAcked(ctx context.Context, key idemstore.Key, w idemstore.Write) (idemstore.Record, bool, error) {
	rec, written, err := s.reserve(ctx, key, w)
	if err != nil || !written {
		return rec, written, err
	}
	rkey := s.Key(key)
	ms, _ := millis(w.TTL) // reserve checked it
	acked, err := s.acknowledge(ctx, rkey, redis.NewCmd(ctx, "pexpire", rkey, ms))
	if acked && err == nil {
		return rec, true, nil
	}
	if err == nil {
		err = fmt.Errorf("%w (the record was gone before the WAIT)", ErrNotAcknowledged)
	}
	if w.State == idemstore.StatePending {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), releaseTimeout)
		_, _ = s.Release(rctx, key, w.Token)
		cancel()
	}
	return idemstore.Record{}, false, storageError(idemevent.MethodReserve, err)
}

// releaseTimeout bounds the release of a reservation that was not
// acknowledged, sent after the call's own deadline may have passed.
const releaseTimeout = 500 * time.Millisecond

// completeAcked is Complete with acknowledgement: complete.lua as without,
// then acknowledge; when complete.lua found no pending record of the owner,
// acknowledge with confirm.lua as the touch, which touches the record only
// if it is the owner's in the completion's state: a completion sent again
// after one that went through but was not acknowledged.
func (s *Store) completeAcked(ctx context.Context, key idemstore.Key, token string, c idemstore.Completion) (bool, error) {
	ok, err := s.complete(ctx, key, token, c)
	if err != nil {
		return false, err
	}
	rkey := s.Key(key)
	ms, _ := millis(c.TTL) // complete checked it
	touch := redis.NewCmd(ctx, "pexpire", rkey, ms)
	if !ok {
		state := argStateCompleted
		if c.State == idemstore.StateNotReplayable {
			state = argStateNotReplayable
		}
		touch = redis.NewCmd(ctx, "eval", confirmSrc, 1, rkey, storedToken(token), state, ms)
	}
	acked, err := s.acknowledge(ctx, rkey, touch)
	if err != nil {
		return false, storageError(idemevent.MethodComplete, err)
	}
	return acked, nil
}
