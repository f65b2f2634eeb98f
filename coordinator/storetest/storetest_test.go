package storetest_test

import (
	"context"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idempotency/coordinator/idemstore"

	"github.com/idemkit/idempotency/coordinator/memstore"
	"github.com/idemkit/idempotency/coordinator/storetest"
)

// harness returns a Harness over store wrapping a fresh memstore on a fake
// clock.
func harness(wrap func(*memstore.Store) idemstore.Store) func(t *testing.T) storetest.Harness {
	return func(t *testing.T) storetest.Harness {
		clock := memstore.NewFakeClock(time.Unix(1e9, 0))
		inner := memstore.New(memstore.WithClock(clock.Now))
		return storetest.Harness{
			Store:   wrap(inner),
			Advance: clock.Advance,
			Corrupt: func(t *testing.T, key idemstore.Key) {
				inner.Put(key, idemstore.Record{State: idemstore.StateUnreadable, TTL: time.Minute})
			},
		}
	}
}

// noTTL is a store that does not report TTLs.
type noTTL struct{ *memstore.Store }

func (s noTTL) Reserve(ctx context.Context, key idemstore.Key, w idemstore.Write) (idemstore.Record, bool, error) {
	rec, ok, err := s.Store.Reserve(ctx, key, w)
	rec.TTL = 0
	return rec, ok, err
}

func (s noTTL) Get(ctx context.Context, key idemstore.Key) (idemstore.Record, error) {
	rec, err := s.Store.Get(ctx, key)
	rec.TTL = 0
	return rec, err
}

func TestTTLUnknown(t *testing.T) {
	storetest.TestStore(t, func(t *testing.T) storetest.Harness {
		h := harness(func(s *memstore.Store) idemstore.Store { return noTTL{s} })(t)
		h.TTLUnknown = true
		return h
	})
}

func TestWithoutCorrupt(t *testing.T) {
	storetest.TestStore(t, func(t *testing.T) storetest.Harness {
		h := harness(func(s *memstore.Store) idemstore.Store { return s })(t)
		h.Corrupt = nil
		return h
	})
}

// Stores that each break one rule of the contract, and the subtests that
// must catch them.
var broken = map[string]struct {
	wrap  func(*memstore.Store) idemstore.Store
	fails []string
}{
	"CompleteIgnoresToken": {
		func(s *memstore.Store) idemstore.Store { return completeAnyToken{s} },
		[]string{"Complete/NotOwner", "Expiry/ExpiredLeaseIsLost"},
	},
	"ReleaseAnyState": {
		func(s *memstore.Store) idemstore.Store { return releaseAnyState{s} },
		[]string{"Release/Completed"},
	},
	"ReplacePending": {
		func(s *memstore.Store) idemstore.Store { return replacePending{s} },
		[]string{"Replace/PendingIsNeverReplaced"},
	},
	"RenewKeepsTTL": {
		func(s *memstore.Store) idemstore.Store { return renewKeepsTTL{s} },
		[]string{"Renew/Owner", "Renew/OwnerOutlivesFirstLease"},
	},
	"IgnoresOperation": {
		func(s *memstore.Store) idemstore.Store { return ignoresOperation{s} },
		[]string{"Keys/Distinct"},
	},
	"LosesNotReplayable": {
		func(s *memstore.Store) idemstore.Store { return losesNotReplayable{s} },
		[]string{"NotReplayable/CompleteKeepsIt", "NotReplayable/WriteKeepsIt"},
	},
	"ReserveManyKeepsPartial": {
		func(s *memstore.Store) idemstore.Store { return reserveManyPartial{s} },
		[]string{"Bulk/ReserveManyAllOrNothing"},
	},
	"CompleteManyIgnoresToken": {
		func(s *memstore.Store) idemstore.Store { return completeManyAnyToken{s} },
		[]string{"Bulk/CompleteManyOwners", "Bulk/ManyKeys"},
	},
	"NotAtomic": {
		func(s *memstore.Store) idemstore.Store { return &notAtomic{Store: s} },
		[]string{"Concurrency/ReserveOneWinner", "Concurrency/ReplaceCompletedOneWinner"},
	},
}

// TestBrokenStore runs the suite on the broken store named by
// $STORETEST_BROKEN; TestSuiteCatchesBrokenStores runs it in a child process,
// because it fails.
func TestBrokenStore(t *testing.T) {
	name := os.Getenv("STORETEST_BROKEN")
	if name == "" {
		t.Skip("run by TestSuiteCatchesBrokenStores")
	}
	b := broken[name]
	storetest.TestStore(t, func(t *testing.T) storetest.Harness {
		h := harness(b.wrap)(t)
		if s, ok := h.Store.(*notAtomic); ok && slices.ContainsFunc(b.fails, func(sub string) bool {
			return strings.HasSuffix(t.Name(), "/"+sub)
		}) {
			// A subtest that must catch the race: make its callers lose it.
			s.race = &rendezvous{both: make(chan struct{})}
		}
		return h
	})
}

func TestSuiteCatchesBrokenStores(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the test binary again; skipped with -short")
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatalf("os.Executable: %v", err)
	}
	for name, b := range broken {
		t.Run(name, func(t *testing.T) {
			// A broken store that deadlocks fails with a stack dump
			// rather than hanging until the parent's timeout.
			cmd := exec.CommandContext(t.Context(), exe, "-test.run=^TestBrokenStore$", "-test.v", "-test.timeout=1m")
			cmd.Env = append(os.Environ(), "STORETEST_BROKEN="+name)
			out, err := cmd.CombinedOutput()
			if err == nil {
				t.Fatalf("the suite passed a store that breaks the contract:\n%s", out)
			}
			for _, sub := range b.fails {
				if !strings.Contains(string(out), "--- FAIL: TestBrokenStore/"+sub+" ") {
					t.Errorf("subtest %s did not fail; output:\n%s", sub, out)
				}
			}
		})
	}
}

type completeAnyToken struct{ *memstore.Store }

func (s completeAnyToken) Complete(ctx context.Context, key idemstore.Key, _ string, c idemstore.Completion) (bool, error) {
	return s.Store.Complete(ctx, key, s.Snapshot(key).Token, c)
}

type releaseAnyState struct{ *memstore.Store }

func (s releaseAnyState) Release(ctx context.Context, key idemstore.Key, token string) (bool, error) {
	if rec := s.Snapshot(key); rec.State != idemstore.StateAbsent && rec.Token == token {
		s.Put(key, idemstore.Record{})
		return true, nil
	}
	return false, nil
}

type replacePending struct{ *memstore.Store }

func (s replacePending) Reserve(ctx context.Context, key idemstore.Key, w idemstore.Write) (idemstore.Record, bool, error) {
	if rec := s.Snapshot(key); w.Replace && rec.State == idemstore.StatePending && rec.Token == w.ReplaceToken {
		s.Put(key, idemstore.Record{State: w.State, Token: w.Token, Fingerprint: w.Fingerprint, TTL: w.TTL})
		return idemstore.Record{}, true, nil
	}
	return s.Store.Reserve(ctx, key, w)
}

// losesNotReplayable keeps a not-replayable result as a completed one, as
// redisrepo did before it had the state.
type losesNotReplayable struct{ *memstore.Store }

func (s losesNotReplayable) Reserve(ctx context.Context, key idemstore.Key, w idemstore.Write) (idemstore.Record, bool, error) {
	if w.State == idemstore.StateNotReplayable {
		w.State = idemstore.StateCompleted
	}
	return s.Store.Reserve(ctx, key, w)
}

func (s losesNotReplayable) Complete(ctx context.Context, key idemstore.Key, token string, c idemstore.Completion) (bool, error) {
	c.State = idemstore.StateCompleted
	return s.Store.Complete(ctx, key, token, c)
}

type renewKeepsTTL struct{ *memstore.Store }

func (s renewKeepsTTL) Renew(_ context.Context, key idemstore.Key, token string, _ time.Duration) (bool, error) {
	rec := s.Snapshot(key)
	return rec.State == idemstore.StatePending && rec.Token == token, nil
}

type ignoresOperation struct{ *memstore.Store }

func (s ignoresOperation) strip(key idemstore.Key) idemstore.Key {
	return idemstore.Key{Key: key.Key}
}

func (s ignoresOperation) Reserve(ctx context.Context, key idemstore.Key, w idemstore.Write) (idemstore.Record, bool, error) {
	return s.Store.Reserve(ctx, s.strip(key), w)
}

func (s ignoresOperation) Get(ctx context.Context, key idemstore.Key) (idemstore.Record, error) {
	return s.Store.Get(ctx, s.strip(key))
}

func (s ignoresOperation) Complete(ctx context.Context, key idemstore.Key, token string, c idemstore.Completion) (bool, error) {
	return s.Store.Complete(ctx, s.strip(key), token, c)
}

func (s ignoresOperation) Release(ctx context.Context, key idemstore.Key, token string) (bool, error) {
	return s.Store.Release(ctx, s.strip(key), token)
}

func (s ignoresOperation) Renew(ctx context.Context, key idemstore.Key, token string, lease time.Duration) (bool, error) {
	return s.Store.Renew(ctx, s.strip(key), token, lease)
}

// notAtomic reads, then writes: the check-then-set race of a store without
// a script. With race set, a caller that finds the key writable for a
// reservation waits, between its read and its write, until a second caller
// has found it writable too: the two both write, every time, rather than
// when the scheduler happens to interleave them. race is set only in the
// concurrency subtests that must catch it, where the reservations are made
// by many callers at once (a lone caller would wait for ever).
type notAtomic struct {
	*memstore.Store
	race *rendezvous
}

func (s *notAtomic) Reserve(ctx context.Context, key idemstore.Key, w idemstore.Write) (idemstore.Record, bool, error) {
	rec := s.Snapshot(key)
	replaceable := w.Replace && rec.State != idemstore.StatePending && rec.Token == w.ReplaceToken
	if rec.State != idemstore.StateAbsent && !replaceable {
		return rec, false, nil
	}
	if s.race != nil && w.State == idemstore.StatePending {
		s.race.arrive()
	}
	s.Put(key, idemstore.Record{State: w.State, Token: w.Token, Fingerprint: w.Fingerprint, Result: w.Result, TTL: w.TTL})
	return idemstore.Record{}, true, nil
}

// rendezvous holds its first caller until a second one arrives; from then
// on it holds nobody.
type rendezvous struct {
	mu   sync.Mutex
	n    int
	both chan struct{} // closed by the second arrival
}

func (r *rendezvous) arrive() {
	r.mu.Lock()
	r.n++
	if r.n == 2 {
		close(r.both)
	}
	r.mu.Unlock()
	<-r.both
}

// reserveManyPartial ignores allOrNothing: it keeps what it wrote when an
// entry collides.
type reserveManyPartial struct{ *memstore.Store }

func (s reserveManyPartial) ReserveMany(ctx context.Context, keys []idemstore.Key, ws []idemstore.Write, _ bool) ([]idemstore.Record, []bool, error) {
	return s.Store.ReserveMany(ctx, keys, ws, false)
}

// completeManyAnyToken completes each entry with the token of the record
// it finds.
type completeManyAnyToken struct{ *memstore.Store }

func (s completeManyAnyToken) CompleteMany(ctx context.Context, keys []idemstore.Key, _ []string, cs []idemstore.Completion) ([]bool, error) {
	tokens := make([]string, len(keys))
	for i, k := range keys {
		tokens[i] = s.Snapshot(k).Token
	}
	return s.Store.CompleteMany(ctx, keys, tokens, cs)
}
