package redisstream_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idempotency/coordinator/idemevent"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idempotency/coordinator"
	"github.com/idemkit/idempotency/coordinator/faultstore"
	"github.com/idemkit/idempotency/idemconsume"
	"github.com/idemkit/idempotency/idemconsume/redisstream"
)

// Four consumers of one group share a stream in which the producer
// published some messages twice, and a quarter of the acknowledgements are
// lost (the consumer crashed after the effect): each message has exactly
// one effect.
func TestFourConsumersOneEffectPerMessage(t *testing.T) {
	e := newEnv(t)
	const unique, copies = 150, 50
	var keys []string
	for i := range unique {
		keys = append(keys, "order-"+strconv.Itoa(i))
	}
	for i := range unique + copies {
		e.publish(keys[i%unique], "amount", strconv.Itoa(i%unique))
	}

	c := e.coordinator(e.store)
	p := e.processor(c)
	fx := newEffects()
	handle := func(ctx context.Context, m idemconsume.Message) error {
		time.Sleep(time.Duration(rand.IntN(2000)) * time.Microsecond)
		fx.add(m.Fields["idempotency-key"])
		return nil
	}
	var dropped sync.Map
	var n atomic.Int64
	client := lossyAcks{Client: e.rdb, drop: func(id string) bool {
		if n.Add(1)%4 != 0 {
			return false
		}
		_, seen := dropped.LoadOrStore(id, true)
		return !seen // each entry loses one ack at most
	}}
	dec := newDecisions()
	for i := range 4 {
		e.start(client, p, handle, fast(redisstream.WithConsumerName("c"+strconv.Itoa(i)),
			redisstream.WithBatchSize(5), redisstream.WithOnDecision(dec.hook))...)
	}
	eventually(t, 30*time.Second, "the stream is not drained", e.drained)
	e.stopAll()
	fx.check(t, keys)

	lost := 0
	dropped.Range(func(any, any) bool { lost++; return true })
	t.Logf("%d entries (%d copies), 4 consumers, %d acks lost: decisions %v", unique+copies, copies, lost, dec)
	if got := dec.get(idemconsume.ReasonProcessed); got != unique {
		t.Errorf("%d processed, want %d", got, unique)
	}
	if got := dec.get(idemconsume.ReasonDuplicate); got < copies+lost {
		t.Errorf("%d duplicates, want at least %d copies + %d redeliveries", got, copies, lost)
	}
	if lost == 0 {
		t.Error("no ack was lost: the redelivery path was not exercised")
	}
}

// A consumer is killed (its context cancelled) with handlers in the middle
// of their work and acknowledgements lost; another consumer claims its
// pending entries with XCLAIM and each message has one effect.
func TestKilledConsumerEntriesAreClaimed(t *testing.T) {
	e := newEnv(t)
	const total = 40
	var keys []string
	for i := range total {
		keys = append(keys, "order-"+strconv.Itoa(i))
		e.publish(keys[i])
	}
	p := e.processor(e.coordinator(e.store))
	fx := newEffects()

	// The victim: its even messages make their effect, but the acks never
	// reach Redis; on its odd messages, the handler is stuck in the middle
	// of its work until the kill. A killed process does not release its
	// reservations either: they stay until their lease (3s) runs out.
	dead := faultstore.Wrap(e.store)
	dead.Fail(idemevent.MethodRelease, errors.New("killed"))
	var stuck atomic.Int64
	victim := e.start(lossyAcks{Client: e.rdb, drop: func(string) bool { return true }}, e.processor(e.coordinator(dead)),
		func(ctx context.Context, m idemconsume.Message) error {
			key := m.Fields["idempotency-key"]
			i, _ := strconv.Atoi(key[len("order-"):])
			if i%2 == 0 {
				fx.add(key)
				return nil
			}
			stuck.Add(1)
			<-ctx.Done()
			return ctx.Err()
		},
		fast(redisstream.WithConsumerName("victim"), redisstream.WithWorkers(4), redisstream.WithBatchSize(5))...)
	eventually(t, 10*time.Second, "the victim's handlers are not all stuck", func() bool { return stuck.Load() == 4 })
	victim.stop()

	g := e.groupInfo()
	if g.Pending == 0 {
		t.Fatal("the victim left nothing pending")
	}
	dec := newDecisions()
	var claimed atomic.Int64
	e.start(e.rdb, p, func(ctx context.Context, m idemconsume.Message) error {
		if m.Deliveries > 1 {
			claimed.Add(1)
		}
		fx.add(m.Fields["idempotency-key"])
		return nil
	}, fast(redisstream.WithConsumerName("rescuer"), redisstream.WithOnDecision(dec.hook))...)
	eventually(t, 20*time.Second, "the stream is not drained", e.drained)
	e.stopAll()
	fx.check(t, keys)
	t.Logf("%d entries; the victim left %d pending; the rescuer ran %d claimed ones: decisions %v",
		total, g.Pending, claimed.Load(), dec)
	if claimed.Load() == 0 || dec.get(idemconsume.ReasonDuplicate) == 0 {
		t.Error("the rescuer neither ran nor acknowledged a claimed entry")
	}
}

// A message whose key another consumer holds is not acknowledged; it is
// retried later, and acknowledged once the holder has completed it.
func TestInProgressElsewhereIsRetried(t *testing.T) {
	e := newEnv(t)
	c := e.coordinator(e.store, coordinator.WithInFlight(coordinator.InFlightRaise))
	p := e.processor(c)

	// The holder: another consumer in the middle of the message's handler.
	started, release := make(chan struct{}), make(chan struct{})
	holder := make(chan idemconsume.Decision, 1)
	go func() {
		holder <- p.Process(context.Background(), idemconsume.Message{ID: "elsewhere", Fields: map[string]string{"idempotency-key": "order-1"}, Deliveries: 1},
			func(context.Context, idemconsume.Message) error { close(started); <-release; return nil })
	}()
	<-started

	id := e.publish("order-1")
	dec := newDecisions()
	var runs atomic.Int64
	e.start(e.rdb, p, func(context.Context, idemconsume.Message) error { runs.Add(1); return nil },
		fast(redisstream.WithOnDecision(dec.hook))...)
	eventually(t, 10*time.Second, "no second in_progress decision", func() bool { return dec.get(idemconsume.ReasonInProgress) >= 2 })
	pend, err := e.rdb.XPendingExt(t.Context(), &redis.XPendingExtArgs{Stream: e.stream, Group: e.group, Start: "-", End: "+", Count: 10}).Result()
	if err != nil || len(pend) != 1 || pend[0].ID != id || pend[0].RetryCount < 2 {
		t.Fatalf("pending %+v, %v; want the entry, delivered at least twice", pend, err)
	}
	dec.mu.Lock()
	first := dec.d[0]
	dec.mu.Unlock()
	if first.RetryAfter <= 0 || !errors.Is(first.Err, coordinator.ErrInProgress) {
		t.Errorf("decision %v: RetryAfter %v, error %v", first, first.RetryAfter, first.Err)
	}

	close(release)
	if d := <-holder; d.Action != idemconsume.Ack {
		t.Fatalf("holder: %v", d)
	}
	eventually(t, 10*time.Second, "the stream is not drained", e.drained)
	e.stopAll()
	if runs.Load() != 0 || dec.get(idemconsume.ReasonDuplicate) != 1 {
		t.Errorf("runs %d, decisions %v; want no run and one duplicate", runs.Load(), dec)
	}
}

// A message whose handler keeps failing is dead-lettered on its
// MaxDeliveries'th delivery; one that fails permanently on its first.
func TestPoisonGoesToDeadLetter(t *testing.T) {
	e := newEnv(t)
	p := e.processor(e.coordinator(e.store), idemconsume.WithMaxDeliveries(3))
	failing := e.publish("order-1", "amount", "5")
	permanent := e.publish("order-2", "amount", "x")
	runs := map[string]*atomic.Int64{"order-1": {}, "order-2": {}}
	c := e.start(e.rdb, p, func(_ context.Context, m idemconsume.Message) error {
		runs[m.Fields["idempotency-key"]].Add(1)
		if m.Fields["amount"] == "x" {
			return idemconsume.Permanent(errors.New("amount is not a number"))
		}
		return errors.New("ledger unavailable")
	}, fast(redisstream.WithMinIdle(100*time.Millisecond), redisstream.WithClaimInterval(20*time.Millisecond))...)

	eventually(t, 10*time.Second, "the stream is not drained", e.drained)
	dead, err := e.rdb.XRange(t.Context(), c.DeadLetterStream(), "-", "+").Result()
	if err != nil || len(dead) != 2 {
		t.Fatalf("dead letters %v, %v; want 2", dead, err)
	}
	want := map[string]map[string]any{
		failing: {"idempotency-key": "order-1", "amount": "5", redisstream.FieldDeadReason: "max_deliveries",
			redisstream.FieldDeadDeliveries: "3", redisstream.FieldDeadError: "ledger unavailable"},
		permanent: {"idempotency-key": "order-2", "amount": "x", redisstream.FieldDeadReason: "permanent_error",
			redisstream.FieldDeadDeliveries: "1", redisstream.FieldDeadError: "amount is not a number"},
	}
	for _, d := range dead {
		id, _ := d.Values[redisstream.FieldDeadID].(string)
		for k, v := range want[id] {
			if d.Values[k] != v {
				t.Errorf("dead letter of %s: %s = %v, want %v", id, k, d.Values[k], v)
			}
		}
		if d.Values[redisstream.FieldDeadStream] != e.stream || d.Values[redisstream.FieldDeadGroup] != e.group {
			t.Errorf("dead letter of %s: %v", id, d.Values)
		}
	}
	if runs["order-1"].Load() != 3 || runs["order-2"].Load() != 1 {
		t.Errorf("runs %d and %d, want 3 and 1", runs["order-1"].Load(), runs["order-2"].Load())
	}
}

// With the store down, mode raise leaves the entry pending and does not run
// the handler; once the store is back it is processed. Mode run processes it
// unprotected at once.
func TestStorageErrorModes(t *testing.T) {
	for _, mode := range []coordinator.OnStorageErrorMode{coordinator.OnStorageErrorRaise, coordinator.OnStorageErrorRun} {
		t.Run(string(mode), func(t *testing.T) {
			e := newEnv(t)
			store := faultstore.Wrap(e.store)
			down := errors.New("connection refused")
			store.Fail(idemevent.MethodReserve, down)
			store.Fail(idemevent.MethodReserveMany, down)
			store.Fail(idemevent.MethodGet, down)
			p := e.processor(e.coordinator(store, coordinator.WithOnStorageError(mode)))
			e.publish("order-1")
			dec := newDecisions()
			var runs atomic.Int64
			e.start(e.rdb, p, func(context.Context, idemconsume.Message) error { runs.Add(1); return nil },
				fast(redisstream.WithMinIdle(100*time.Millisecond), redisstream.WithOnDecision(dec.hook))...)

			if mode == coordinator.OnStorageErrorRun {
				eventually(t, 10*time.Second, "the stream is not drained", e.drained)
				e.stopAll()
				if runs.Load() != 1 || dec.get(idemconsume.ReasonUnprotected) != 1 {
					t.Errorf("runs %d, decisions %v; want one unprotected run", runs.Load(), dec)
				}
				return
			}
			eventually(t, 10*time.Second, "no second storage_error decision", func() bool { return dec.get(idemconsume.ReasonStorage) >= 2 })
			if runs.Load() != 0 || e.groupInfo().Pending != 1 {
				t.Fatalf("runs %d, pending %d; want no run and the entry pending", runs.Load(), e.groupInfo().Pending)
			}
			store.Reset()
			eventually(t, 10*time.Second, "the stream is not drained", e.drained)
			e.stopAll()
			if runs.Load() != 1 || dec.get(idemconsume.ReasonProcessed) != 1 {
				t.Errorf("runs %d, decisions %v; want one run", runs.Load(), dec)
			}
		})
	}
}

// A consumer that restarts under its name processes its own pending entries
// at once, without waiting for them to be idle.
func TestRestartUnderTheSameName(t *testing.T) {
	e := newEnv(t)
	p := e.processor(e.coordinator(e.store))
	for i := range 3 {
		e.publish(fmt.Sprintf("order-%d", i))
	}
	first := e.start(e.rdb, p, func(ctx context.Context, _ idemconsume.Message) error { <-ctx.Done(); return ctx.Err() },
		redisstream.WithConsumerName("pod-7"), redisstream.WithBlock(50*time.Millisecond))
	eventually(t, 10*time.Second, "nothing pending", func() bool { return e.groupInfo().Pending == 3 })
	first.stop()

	fx := newEffects()
	dec := newDecisions()
	e.start(e.rdb, p, func(_ context.Context, m idemconsume.Message) error { fx.add(m.Fields["idempotency-key"]); return nil },
		redisstream.WithConsumerName("pod-7"), redisstream.WithBlock(50*time.Millisecond), redisstream.WithOnDecision(dec.hook))
	// The default min-idle (30s) rules out a claim.
	eventually(t, 5*time.Second, "the stream is not drained", e.drained)
	fx.check(t, []string{"order-0", "order-1", "order-2"})
}

func TestNewRefuses(t *testing.T) {
	e := newEnv(t)
	p := e.processor(e.coordinator(e.store))
	h := func(context.Context, idemconsume.Message) error { return nil }
	for name, f := range map[string]func() error{
		"nil client":   func() error { _, err := redisstream.New(nil, p, "s", "g", h); return err },
		"nil handler":  func() error { _, err := redisstream.New(e.rdb, p, "s", "g", nil); return err },
		"no stream":    func() error { _, err := redisstream.New(e.rdb, p, "", "g", h); return err },
		"zero workers": func() error { _, err := redisstream.New(e.rdb, p, "s", "g", h, redisstream.WithWorkers(0)); return err },
		"zero block":   func() error { _, err := redisstream.New(e.rdb, p, "s", "g", h, redisstream.WithBlock(0)); return err },
	} {
		if f() == nil {
			t.Errorf("%s: New accepted it", name)
		}
	}
}
