package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"

	"go.uber.org/fx"
	"go.uber.org/zap"

	"github.com/idemkit/idempotency/coordinator"
)

// This file uses the coordinator directly, without HTTP: a queue consumer
// that processes "refund" messages. Brokers deliver at least once, so the
// same message may arrive twice, even at two workers at the same time;
// coordinator.DoResult, keyed by the message ID, makes the refund happen once.

// refundMessage is a message on the refund queue.
type refundMessage struct {
	ID       string `json:"id"` // the idempotency key: the same on every delivery
	ChargeID string `json:"charge_id"`
	Amount   int64  `json:"amount"`
}

// refundQueue stands in for a message broker (SQS, Kafka, RabbitMQ, ...).
type refundQueue struct {
	ch chan refundMessage
}

func newRefundQueue() *refundQueue { return &refundQueue{ch: make(chan refundMessage, 100)} }

// Publish enqueues msg, waiting while the queue is full.
func (q *refundQueue) Publish(ctx context.Context, msg refundMessage) error {
	select {
	case q.ch <- msg:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// publishRefund is POST /refunds: it puts the message on the queue and
// answers 202. Post the same message twice to play a broker redelivering it.
func publishRefund(q *refundQueue) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var msg refundMessage
		if err := json.NewDecoder(r.Body).Decode(&msg); err != nil {
			writeProblem(w, http.StatusBadRequest, "invalid JSON body: "+err.Error())
			return
		}
		// Check up front what coordinator.DoResult would refuse later.
		if err := coordinator.ValidateKey(msg.ID); err != nil {
			writeProblem(w, http.StatusBadRequest, "id: "+err.Error())
			return
		}
		if msg.ChargeID == "" || msg.Amount <= 0 {
			writeProblem(w, http.StatusBadRequest, "charge_id and a positive amount are required")
			return
		}
		if err := q.Publish(r.Context(), msg); err != nil {
			writeProblem(w, http.StatusServiceUnavailable, "queue: "+err.Error())
			return
		}
		writeJSON(w, http.StatusAccepted, map[string]string{"queued": msg.ID})
	})
}

// consumerWorkers is how many messages the consumer processes at once.
const consumerWorkers = 4

// refundConsumer takes messages off the queue and refunds them, once per
// message ID. Its workers start with the app and stop with it.
type refundConsumer struct {
	c        *coordinator.Coordinator
	queue    *refundQueue
	provider *provider
	ledger   *ledger
	log      *zap.Logger

	mu sync.Mutex
	st consumerStats
}

// consumerStats counts what the consumer did; GET /ledger shows them.
type consumerStats struct {
	Delivered  int `json:"delivered"`  // messages taken off the queue
	Processed  int `json:"processed"`  // refunds made
	Duplicates int `json:"duplicates"` // deliveries answered from Redis: no refund
	Failed     int `json:"failed"`     // deliveries that failed
}

func newRefundConsumer(lc fx.Lifecycle, c *coordinator.Coordinator, q *refundQueue, p *provider, l *ledger, log *zap.Logger) *refundConsumer {
	rc := &refundConsumer{c: c, queue: q, provider: p, ledger: l, log: log.Named("refunds")}
	// The workers are owned by the lifecycle: OnStart starts them, OnStop
	// cancels their context and waits until every one has returned.
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	lc.Append(fx.Hook{
		OnStart: func(context.Context) error {
			for range consumerWorkers {
				wg.Go(func() { rc.work(ctx) })
			}
			return nil
		},
		OnStop: func(stopCtx context.Context) error {
			cancel()
			done := make(chan struct{})
			go func() { wg.Wait(); close(done) }()
			select {
			case <-done:
				return nil
			case <-stopCtx.Done():
				return fmt.Errorf("refund consumer: %w", stopCtx.Err())
			}
		},
	})
	return rc
}

func (rc *refundConsumer) work(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			// Messages still queued are dropped; a real broker would
			// redeliver them to the next consumer.
			return
		case msg := <-rc.queue.ch:
			rc.handle(ctx, msg)
		}
	}
}

// handle processes one delivery of msg.
func (rc *refundConsumer) handle(ctx context.Context, msg refundMessage) {
	// The fingerprint makes a message ID reused for another refund an error
	// (coordinator.ErrKeyReuse) instead of a silent replay.
	fp, err := coordinator.Fingerprint(msg.ChargeID, msg.Amount)
	if err != nil {
		rc.count(func(s *consumerStats) { s.Delivered++; s.Failed++ })
		rc.log.Error("refund message: fingerprint", zap.Error(err))
		return
	}

	// DoResult is Do that also says whether the result was replayed: a
	// replay means this delivery is a duplicate of one already processed.
	res, err := coordinator.DoResult(ctx, rc.c, coordinator.Call{
		Operation:   "refund.process",
		Key:         msg.ID,
		Fingerprint: fp,
		TTL:         24 * time.Hour, // longer than the broker may redeliver
	}, func(ctx context.Context) (Refund, error) {
		r, err := rc.provider.Refund(ctx, msg.ID, msg.ChargeID, msg.Amount)
		if err != nil {
			return Refund{}, err // not stored: a redelivery tries again
		}
		rc.ledger.AddRefund(r)
		return r, nil
	})

	switch {
	case err != nil:
		// ErrKeyReuse, ErrInProgress, a cancelled context, the provider's
		// error... A real consumer would nack the message (or dead-letter it
		// on ErrKeyReuse) and let the broker redeliver.
		rc.count(func(s *consumerStats) { s.Delivered++; s.Failed++ })
		rc.log.Warn("refund failed", zap.String("message_id", msg.ID), zap.Bool("key_reuse", errors.Is(err, coordinator.ErrKeyReuse)), zap.Error(err))
	case res.Replayed:
		rc.count(func(s *consumerStats) { s.Delivered++; s.Duplicates++ })
		rc.log.Info("duplicate refund message: already processed", zap.String("message_id", msg.ID), zap.String("refund", res.Value.ID))
	default:
		rc.count(func(s *consumerStats) { s.Delivered++; s.Processed++ })
		rc.log.Info("refund processed", zap.String("message_id", msg.ID), zap.String("refund", res.Value.ID))
	}
}

func (rc *refundConsumer) count(f func(*consumerStats)) {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	f(&rc.st)
}

func (rc *refundConsumer) stats() consumerStats {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return rc.st
}
