package idemwatermill_test

import (
	"errors"
	"slices"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/idemkit/idempotency/idemconsume"
	"github.com/idemkit/idempotency/idemwatermill"
)

func TestHandleBatch(t *testing.T) {
	var seen []idemconsume.Decision
	d := newDeduplicator(t, newProcessor(t), idemwatermill.WithOnDecision(func(_ *message.Message, dec idemconsume.Decision) {
		seen = append(seen, dec)
	}))
	runs := map[string]int{}
	h := func(msg *message.Message) ([]*message.Message, error) {
		key := msg.Metadata.Get(idemconsume.DefaultKeyField)
		runs[key]++
		switch key {
		case "fails":
			return nil, errors.New("try again")
		case "poison":
			return nil, idemconsume.Permanent(errors.New("never"))
		}
		return []*message.Message{message.NewMessage("out-"+msg.UUID, nil)}, nil
	}
	msgs := []*message.Message{
		order("1", "a"),
		order("2", "fails"),
		order("3", "b"),
		order("4", "a"), // a producer's copy of a, in the same batch
		order("5", "poison"),
		order("6", ""), // no key field: the UUID is the key
	}
	produced, errs := d.HandleBatch(msgs, h)
	want := []struct {
		out      string // the produced message's UUID, or ""
		err      bool
		deadLeft bool
	}{
		{"out-1", false, false},
		{"", true, false},
		{"out-3", false, false},
		{"", false, false}, // a duplicate: acknowledged, nothing produced
		{"", true, true},
		{"out-6", false, false},
	}
	for i, w := range want {
		out := ""
		if len(produced[i]) == 1 {
			out = produced[i][0].UUID
		}
		var de *idemwatermill.DecisionError
		if out != w.out || (errs[i] != nil) != w.err || w.err && !errors.As(errs[i], &de) || idemwatermill.IsDeadLetter(errs[i]) != w.deadLeft {
			t.Errorf("delivery %s: produced %q, error %v; want %q, error %v, dead letter %v", msgs[i].UUID, out, errs[i], w.out, w.err, w.deadLeft)
		}
	}
	for k, n := range map[string]int{"a": 1, "b": 1, "fails": 1, "poison": 1, "": 1} {
		if runs[k] != n {
			t.Errorf("key %q ran %d times, want %d", k, runs[k], n)
		}
	}
	if len(seen) != len(msgs) {
		t.Errorf("%d decisions reported, want %d", len(seen), len(msgs))
	}

	// The batch again: the done keys replay, the failed one runs again.
	produced, errs = d.HandleBatch([]*message.Message{order("1", "a"), order("2", "fails")}, h)
	if errs[0] != nil || len(produced[0]) != 0 || errs[1] == nil || runs["a"] != 1 || runs["fails"] != 2 {
		t.Errorf("second batch: produced %v, errors %v, runs %v", produced, errs, runs)
	}
	if p, e := d.HandleBatch(nil, h); len(p) != 0 || len(e) != 0 {
		t.Errorf("an empty batch: %v, %v", p, e)
	}
}

// TestHandleBatchSharedUUID runs batches whose deliveries share a UUID, as
// NATS messages from a publisher other than Watermill do (an empty one): h
// runs on each delivery's own message, also after a delivery with the same
// UUID that it did not run for, and what it produced goes to that delivery.
func TestHandleBatchSharedUUID(t *testing.T) {
	for _, tc := range []struct {
		name string
		done []string // the keys completed before the batch
		keys []string // the batch's keys, every message with UUID ""
		want []string // each delivery's produced message's UUID, or ""
		dead []bool   // each delivery's dead-lettering
	}{
		{"after a replay", []string{"a"}, []string{"a", "b"}, []string{"", "out-b"}, []bool{false, false}},
		{"around a bad key", nil, []string{"c", "not a key", "d"}, []string{"out-c", "", "out-d"}, []bool{false, true, false}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			runs := map[string]int{}
			h := func(msg *message.Message) ([]*message.Message, error) {
				key := msg.Metadata.Get(idemconsume.DefaultKeyField)
				runs[key]++
				return []*message.Message{message.NewMessage("out-"+key, nil)}, nil
			}
			d := newDeduplicator(t, newProcessor(t))
			for _, k := range tc.done {
				if _, err := d.Middleware(h)(order("", k)); err != nil {
					t.Fatalf("completing %q: %v", k, err)
				}
			}
			clear(runs)
			msgs := make([]*message.Message, len(tc.keys))
			for i, k := range tc.keys {
				msgs[i] = order("", k)
			}
			produced, errs := d.HandleBatch(msgs, h)
			for i, k := range tc.keys {
				var out []string
				for _, m := range produced[i] {
					out = append(out, m.UUID)
				}
				want := []string(nil)
				if tc.want[i] != "" {
					want = []string{tc.want[i]}
				}
				if !slices.Equal(out, want) || (errs[i] != nil) != tc.dead[i] || idemwatermill.IsDeadLetter(errs[i]) != tc.dead[i] {
					t.Errorf("delivery %d (key %q): produced %q, error %v; want %q, dead letter %v", i, k, out, errs[i], want, tc.dead[i])
				}
				wantRuns := 1
				if tc.want[i] == "" {
					wantRuns = 0
				}
				if runs[k] != wantRuns {
					t.Errorf("key %q ran %d times in the batch, want %d", k, runs[k], wantRuns)
				}
			}
		})
	}
}
