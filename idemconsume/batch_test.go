package idemconsume_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/idemkit/idempotency/coordinator/idemevent"
	"github.com/idemkit/idempotency/coordinator/idemstore"

	"github.com/idemkit/idempotency/coordinator"
	"github.com/idemkit/idempotency/coordinator/faultstore"
	"github.com/idemkit/idempotency/coordinator/memstore"
	"github.com/idemkit/idempotency/idemconsume"
)

// batchCase is one delivery of the table that Process and ProcessBatch
// must decide alike.
type batchCase struct {
	name   string
	msg    idemconsume.Message
	action idemconsume.Action
	reason idemconsume.Reason
	runs   int // of the handler, for this delivery's key
}

// entry is a delivery of key with amount, delivered n times.
func entry(id, key, amount string, n int64) idemconsume.Message {
	f := map[string]string{"amount": amount}
	if key != "" {
		f["idempotency-key"] = key
	}
	return idemconsume.Message{ID: id, Fields: f, Deliveries: n}
}

var batchCases = []batchCase{
	{"new", entry("1-0", "new", "5", 1), idemconsume.Ack, idemconsume.ReasonProcessed, 1},
	{"done before", entry("2-0", "done", "5", 2), idemconsume.Ack, idemconsume.ReasonDuplicate, 0},
	{"held elsewhere", entry("3-0", "held", "5", 1), idemconsume.Retry, idemconsume.ReasonInProgress, 0},
	{"another request's key", entry("4-0", "reused", "6", 1), idemconsume.DeadLetter, idemconsume.ReasonKeyReuse, 0},
	{"not replayable", entry("5-0", "gone", "5", 1), idemconsume.Ack, idemconsume.ReasonDuplicate, 0},
	{"bad key", entry("6-0", "has space", "5", 1), idemconsume.DeadLetter, idemconsume.ReasonBadMessage, 0},
	{"over the limit", entry("7-0", "poison", "5", 4), idemconsume.DeadLetter, idemconsume.ReasonMaxDeliveries, 0},
	{"fails", entry("8-0", "fails", "5", 1), idemconsume.Retry, idemconsume.ReasonHandlerError, 1},
	{"fails for good", entry("9-0", "permanent", "5", 1), idemconsume.DeadLetter, idemconsume.ReasonPermanent, 1},
	{"panics", entry("10-0", "panics", "5", 3), idemconsume.DeadLetter, idemconsume.ReasonMaxDeliveries, 1},
	{"new, again in the batch", entry("11-0", "new", "5", 1), idemconsume.Ack, idemconsume.ReasonDuplicate, 1},
}

// batchSetup is a processor over a store that holds the records the table
// expects, and a handler that counts its runs per key.
func batchSetup(t *testing.T, opts ...coordinator.Option) (*idemconsume.Processor, map[string]int, idemconsume.Handler, *faultstore.Store) {
	s := memstore.New()
	op := "test.consume"
	put := func(key string, rec idemstore.Record) {
		rec.TTL = time.Hour
		s.Put(idemstore.Key{Operation: op, Key: key}, rec)
	}
	fp, _ := coordinator.Fingerprint("5")
	put("done", idemstore.Record{State: idemstore.StateCompleted, Token: "t", Fingerprint: fp, Result: []byte("{}")})
	put("held", idemstore.Record{State: idemstore.StatePending, Token: "other"})
	put("reused", idemstore.Record{State: idemstore.StateCompleted, Token: "t", Fingerprint: fp, Result: []byte("{}")})
	put("gone", idemstore.Record{State: idemstore.StateNotReplayable, Token: "t", Result: []byte("too big")})
	fs := faultstore.Wrap(s)
	c := newCoordinator(t, fs, append([]coordinator.Option{coordinator.WithInFlight(coordinator.InFlightRaise)}, opts...)...)
	p := newProcessor(t, c, idemconsume.WithMaxDeliveries(3),
		idemconsume.WithFingerprint(func(m idemconsume.Message) (string, error) { return coordinator.Fingerprint(m.Fields["amount"]) }))
	runs := map[string]int{}
	handle := func(_ context.Context, m idemconsume.Message) error {
		k := m.Fields["idempotency-key"]
		runs[k]++
		switch k {
		case "fails":
			return errors.New("try again")
		case "permanent":
			return idemconsume.Permanent(errors.New("never"))
		case "panics":
			panic("boom")
		}
		return nil
	}
	return p, runs, handle, fs
}

func TestProcessBatchDecidesAsProcess(t *testing.T) {
	msgs := make([]idemconsume.Message, len(batchCases))
	for i, c := range batchCases {
		msgs[i] = c.msg
	}
	one, oneRuns, oneHandle, _ := batchSetup(t)
	batch, batchRuns, batchHandle, fs := batchSetup(t)
	ds := batch.ProcessBatch(t.Context(), msgs, batchHandle)
	for i, c := range batchCases {
		want := one.Process(t.Context(), c.msg, oneHandle)
		got := ds[i]
		if got.Action != want.Action || got.Reason != want.Reason || got.Key != want.Key || (got.Err == nil) != (want.Err == nil) {
			t.Errorf("%s: ProcessBatch decided %v (%v), Process %v (%v)", c.name, got, got.Err, want, want.Err)
		}
		if got.Action != c.action || got.Reason != c.reason {
			t.Errorf("%s: decided %v (%v), want %v (%s)", c.name, got, got.Err, c.action, c.reason)
		}
		k := c.msg.Fields["idempotency-key"]
		if batchRuns[k] != c.runs || oneRuns[k] != c.runs {
			t.Errorf("%s: the handler ran %d times in the batch and %d one by one, want %d", c.name, batchRuns[k], oneRuns[k], c.runs)
		}
	}
	if n := fs.Calls(idemevent.MethodReserveMany); n != 1 {
		t.Errorf("%d ReserveMany calls for the batch, want 1", n)
	}
	// The key met twice: its second delivery is a call of its own, after
	// the batch, and replays. The held key is read again at its turn, as
	// actions of the batch ran before it (the holder might have finished).
	if r, c := fs.Calls(idemevent.MethodReserve), fs.Calls(idemevent.MethodComplete); r != 2 || c != 0 {
		t.Errorf("%d single-key reserves and %d completions for the batch, want 2 (the key met twice, the held key read again) and 0", r, c)
	}
}

func TestProcessBatchStoreDown(t *testing.T) {
	for _, mode := range []coordinator.OnStorageErrorMode{coordinator.OnStorageErrorRaise, coordinator.OnStorageErrorRun} {
		t.Run(string(mode), func(t *testing.T) {
			p, runs, handle, fs := batchSetup(t, coordinator.WithOnStorageError(mode))
			fs.Fail(idemevent.MethodReserveMany, errors.New("connection refused"))
			fs.Fail(idemevent.MethodReserve, errors.New("connection refused"))
			ds := p.ProcessBatch(t.Context(), []idemconsume.Message{entry("1-0", "a", "5", 1), entry("2-0", "b", "5", 1)}, handle)
			for i, d := range ds {
				switch mode {
				case coordinator.OnStorageErrorRaise:
					check(t, d, idemconsume.Retry, idemconsume.ReasonStorage)
				default:
					check(t, d, idemconsume.Ack, idemconsume.ReasonUnprotected)
				}
				want := 0
				if mode == coordinator.OnStorageErrorRun {
					want = 1
				}
				if k := fmt.Sprint([]string{"a", "b"}[i]); runs[k] != want {
					t.Errorf("%s ran %d times, want %d", k, runs[k], want)
				}
			}
		})
	}
}

func TestProcessBatchKillSwitch(t *testing.T) {
	p := newProcessor(t, newCoordinator(t, nil, coordinator.WithEnabled(false)))
	h := &counter{}
	ds := p.ProcessBatch(t.Context(), []idemconsume.Message{{Deliveries: 1}, {Deliveries: 1}}, h.handle)
	for _, d := range ds {
		check(t, d, idemconsume.Ack, idemconsume.ReasonUnprotected)
	}
	if h.runs.Load() != 2 {
		t.Errorf("runs %d, want 2", h.runs.Load())
	}
}

// ProcessBatchIndexed tells the handler each delivery's position in the
// batch, also when deliveries share an ID and when some are not run (a
// replay, a bad key, one over the limit), and with the kill switch on.
func TestProcessBatchIndexedGivesEachDeliveryItsPosition(t *testing.T) {
	msgs := make([]idemconsume.Message, len(batchCases))
	for i, c := range batchCases {
		msgs[i] = c.msg
		msgs[i].ID = "same" // IDs cannot tell deliveries apart
	}
	p, _, handle, _ := batchSetup(t)
	var got []int
	p.ProcessBatchIndexed(t.Context(), msgs, func(ctx context.Context, i int, m idemconsume.Message) error {
		got = append(got, i)
		if m.Fields["idempotency-key"] != batchCases[i].msg.Fields["idempotency-key"] {
			t.Errorf("handler called with position %d for key %q, the delivery there has key %q", i, m.Fields["idempotency-key"], batchCases[i].msg.Fields["idempotency-key"])
		}
		return handle(ctx, m)
	})
	var want []int
	for i, c := range batchCases {
		if c.runs > 0 && c.reason != idemconsume.ReasonDuplicate {
			want = append(want, i)
		}
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("handler ran for positions %v, want %v", got, want)
	}

	off := newProcessor(t, newCoordinator(t, nil, coordinator.WithEnabled(false)))
	got = nil
	off.ProcessBatchIndexed(t.Context(), []idemconsume.Message{{Deliveries: 1}, {Deliveries: 1}}, func(_ context.Context, i int, _ idemconsume.Message) error {
		got = append(got, i)
		return nil
	})
	if fmt.Sprint(got) != "[0 1]" {
		t.Errorf("with the kill switch on, the handler ran for positions %v, want [0 1]", got)
	}
}
