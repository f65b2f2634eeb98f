package idemwatermill_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"

	"github.com/idemkit/idempotency/coordinator"
	"github.com/idemkit/idempotency/idemconsume"
	"github.com/idemkit/idempotency/idemwatermill"
)

// Many deliveries of the same messages at once, copies with the message's
// UUID and copies with a UUID of their own but the same key: each key's
// handler runs once, every delivery is acknowledged, and only the delivery
// that ran the handler returns its produced message.
func TestConcurrentDuplicatesRunOnce(t *testing.T) {
	const keys, copies = 20, 16
	d := newDeduplicator(t, newProcessor(t))
	var mu sync.Mutex
	effects := map[string]int{}
	h := d.Middleware(func(msg *message.Message) ([]*message.Message, error) {
		key := msg.Metadata.Get(idemconsume.DefaultKeyField)
		mu.Lock()
		effects[key]++
		mu.Unlock()
		return []*message.Message{message.NewMessage("out-"+key, nil)}, nil
	})

	var produced atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, keys*copies)
	for k := range keys {
		key := "order-" + strconv.Itoa(k)
		for c := range copies {
			id := key // a redelivery carries the message's UUID
			if c%2 == 1 {
				id = fmt.Sprintf("%s-copy-%d", key, c) // a producer's copy gets a UUID of its own
			}
			wg.Go(func() {
				out, err := h(order(id, key))
				if err != nil {
					errs <- fmt.Errorf("delivery %s of %s: %w", id, key, err)
					return
				}
				produced.Add(int64(len(out)))
			})
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	for k := range keys {
		key := "order-" + strconv.Itoa(k)
		if effects[key] != 1 {
			t.Errorf("%s: the handler ran %d times, want 1", key, effects[key])
		}
	}
	if produced.Load() != keys {
		t.Errorf("%d deliveries returned a produced message, want %d (one per key: a replay returns none)", produced.Load(), keys)
	}
}

// A handler that fails is run again on the next delivery: the key is
// marked only after a success. Watermill's own Deduplicator, which marks a
// message as seen before its handler runs, drops that redelivery.
func TestFailedHandlerIsRunAgainOnRedelivery(t *testing.T) {
	handler := func(runs *int) message.HandlerFunc {
		return func(*message.Message) ([]*message.Message, error) {
			*runs++
			if *runs == 1 {
				return nil, errors.New("ledger unavailable")
			}
			return nil, nil
		}
	}

	t.Run("idemwatermill", func(t *testing.T) {
		var runs int
		h := newDeduplicator(t, newProcessor(t)).Middleware(handler(&runs))
		msg := order("m-1", "order-1")
		_, err := h(msg)
		var de *idemwatermill.DecisionError
		if !errors.As(err, &de) || de.Decision.Action != idemconsume.Retry || de.Decision.Reason != idemconsume.ReasonHandlerError {
			t.Fatalf("first delivery: err = %v, want a *DecisionError with retry (handler_error)", err)
		}
		if idemwatermill.IsDeadLetter(err) {
			t.Errorf("first delivery: %v is a dead letter; a handler error on delivery 1 of 5 is a retry", err)
		}
		for i := 2; i <= 3; i++ {
			if _, err := h(order("m-1", "order-1")); err != nil {
				t.Fatalf("delivery %d: %v", i, err)
			}
		}
		if runs != 2 {
			t.Errorf("the handler ran %d times over a failure, a redelivery and a duplicate, want 2", runs)
		}
	})

	t.Run("watermill Deduplicator", func(t *testing.T) {
		var runs int
		dd := &middleware.Deduplicator{
			KeyFactory: func(m *message.Message) (string, error) { return m.UUID, nil },
			Repository: seenKeys{},
		}
		h := dd.Middleware(handler(&runs))
		if _, err := h(order("m-1", "order-1")); err == nil {
			t.Fatal("first delivery: no error, want the handler's")
		}
		if _, err := h(order("m-1", "order-1")); err != nil {
			t.Fatalf("redelivery: %v", err)
		}
		if runs != 1 {
			t.Errorf("the handler ran %d times; watermill's Deduplicator was expected to drop the redelivery (1 run)", runs)
		}
	})
}

// seenKeys is a middleware.ExpiringKeyRepository without an expiry (and
// without the cleaning goroutine of watermill's map repository).
type seenKeys map[string]bool

func (s seenKeys) IsDuplicate(_ context.Context, key string) (bool, error) {
	seen := s[key]
	s[key] = true
	return seen, nil
}

// Every decision that is not an Ack comes back as a *DecisionError that
// unwraps to the decision's error; dead letters, and only they, match
// ErrDeadLetter.
func TestDecisionErrors(t *testing.T) {
	errLedger := errors.New("ledger unavailable")
	tests := []struct {
		name       string
		opts       []idemconsume.Option
		msg        *message.Message
		handler    message.HandlerFunc
		wantReason idemconsume.Reason
		wantIs     error // the error the *DecisionError must match, besides ErrDeadLetter
		wantRun    bool
	}{{
		name:       "permanent error",
		msg:        order("m-1", "order-1"),
		handler:    func(*message.Message) ([]*message.Message, error) { return nil, idemconsume.Permanent(errLedger) },
		wantReason: idemconsume.ReasonPermanent, wantIs: errLedger, wantRun: true,
	}, {
		name:       "handler error on the last delivery",
		msg:        withDeliveries(order("m-1", "order-1"), "5"),
		handler:    func(*message.Message) ([]*message.Message, error) { return nil, errLedger },
		wantReason: idemconsume.ReasonMaxDeliveries, wantIs: errLedger, wantRun: true,
	}, {
		name:       "delivered more than allowed",
		msg:        withDeliveries(order("m-1", "order-1"), "6"),
		handler:    func(*message.Message) ([]*message.Message, error) { return nil, nil },
		wantReason: idemconsume.ReasonMaxDeliveries, wantIs: idemconsume.ErrMaxDeliveries,
	}, {
		name:       "no key",
		opts:       []idemconsume.Option{idemconsume.WithKey(idemconsume.KeyFromField("order-id"))},
		msg:        order("m-1", "order-1"),
		handler:    func(*message.Message) ([]*message.Message, error) { return nil, nil },
		wantReason: idemconsume.ReasonBadMessage, wantIs: idemconsume.ErrNoKey,
	}, {
		name:       "handler error",
		msg:        withDeliveries(order("m-1", "order-1"), "4"),
		handler:    func(*message.Message) ([]*message.Message, error) { return nil, errLedger },
		wantReason: idemconsume.ReasonHandlerError, wantIs: errLedger, wantRun: true,
	}, {
		name:       "handler panic",
		msg:        order("m-1", "order-1"),
		handler:    func(*message.Message) ([]*message.Message, error) { panic(errLedger) },
		wantReason: idemconsume.ReasonHandlerError, wantIs: errLedger, wantRun: true,
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := newDeduplicator(t, newProcessor(t, tt.opts...), idemwatermill.WithDeliveriesFromMetadata("deliveries"))
			ran := false
			out, err := d.Middleware(func(m *message.Message) ([]*message.Message, error) {
				ran = true
				return tt.handler(m)
			})(tt.msg)
			if out != nil {
				t.Errorf("produced %v, want none", out)
			}
			var de *idemwatermill.DecisionError
			if !errors.As(err, &de) {
				t.Fatalf("err = %v (%T), want a *DecisionError", err, err)
			}
			if de.Decision.Reason != tt.wantReason {
				t.Errorf("decision %v, want reason %s", de.Decision, tt.wantReason)
			}
			if !errors.Is(err, tt.wantIs) {
				t.Errorf("err = %v, does not match %v", err, tt.wantIs)
			}
			if dead := tt.wantReason.Action() == idemconsume.DeadLetter; idemwatermill.IsDeadLetter(err) != dead {
				t.Errorf("IsDeadLetter(%v) = %v, want %v", err, !dead, dead)
			}
			if ran != tt.wantRun {
				t.Errorf("handler ran: %v, want %v", ran, tt.wantRun)
			}
		})
	}
}

func withDeliveries(m *message.Message, n string) *message.Message {
	m.Metadata.Set("deliveries", n)
	return m
}

// While the handler runs, the message's context carries the key's
// reservation; the message's own context is back once it returns.
func TestHandlerContext(t *testing.T) {
	d := newDeduplicator(t, newProcessor(t))
	type ctxKey struct{}
	msg := order("m-1", "order-1")
	orig := context.WithValue(t.Context(), ctxKey{}, "router's")
	msg.SetContext(orig)
	var res coordinator.Reservation
	var ok bool
	var value any
	_, err := d.Middleware(func(m *message.Message) ([]*message.Message, error) {
		res, ok = coordinator.ReservationFromContext(m.Context())
		value = m.Context().Value(ctxKey{})
		return nil, nil
	})(msg)
	if err != nil {
		t.Fatal(err)
	}
	if !ok || res.Key != "order-1" || res.Operation != "billing.credit" || res.Token == "" {
		t.Errorf("reservation in the handler's context: %+v, %v; want one of billing.credit/order-1", res, ok)
	}
	if value != "router's" {
		t.Errorf("the handler's context lost the message's values: %v", value)
	}
	if msg.Context() != orig {
		t.Error("the message's context was not put back after the handler")
	}
}

// WithOnDecision's functions see every delivery's decision, in the order
// they were added.
func TestOnDecision(t *testing.T) {
	var got []string
	d := newDeduplicator(t, newProcessor(t),
		idemwatermill.WithOnDecision(func(m *message.Message, d idemconsume.Decision) { got = append(got, "a:"+m.UUID+":"+d.String()) }),
		idemwatermill.WithOnDecision(nil),
		idemwatermill.WithOnDecision(func(m *message.Message, d idemconsume.Decision) { got = append(got, "b:"+string(d.Reason)) }),
	)
	h := d.Middleware(func(*message.Message) ([]*message.Message, error) { return nil, nil })
	for _, id := range []string{"m-1", "m-2"} {
		if _, err := h(order(id, "order-1")); err != nil {
			t.Fatal(err)
		}
	}
	want := []string{"a:m-1:ack (processed)", "b:processed", "a:m-2:ack (duplicate)", "b:duplicate"}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("decisions seen: %q, want %q", got, want)
	}
}
