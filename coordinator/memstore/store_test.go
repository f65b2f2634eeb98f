package memstore_test

import (
	"bytes"
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/idemkit/idempotency/coordinator/idemstore"

	"github.com/idemkit/idempotency/coordinator/memstore"
	"github.com/idemkit/idempotency/coordinator/storetest"
)

var start = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

func newStore(t *testing.T) (*memstore.Store, *memstore.FakeClock) {
	t.Helper()
	clock := memstore.NewFakeClock(start)
	return memstore.New(memstore.WithClock(clock.Now)), clock
}

func TestConformance(t *testing.T) {
	storetest.TestStore(t, func(t *testing.T) storetest.Harness {
		s, clock := newStore(t)
		return storetest.Harness{
			Store:   s,
			Advance: clock.Advance,
			Fences:  true,
			Corrupt: func(t *testing.T, key idemstore.Key) {
				s.Put(key, idemstore.Record{State: idemstore.StateUnreadable, Result: []byte("\xff garbage"), TTL: time.Minute})
			},
		}
	})
}

// The suite against the real clock, as a Redis store runs it: sleeps instead
// of a fake clock, and a corrupt record that never expires.
func TestConformanceRealClock(t *testing.T) {
	if testing.Short() {
		t.Skip("sleeps; skipped with -short")
	}
	storetest.TestStore(t, func(t *testing.T) storetest.Harness {
		s := memstore.New()
		return storetest.Harness{
			Store:  s,
			Tick:   20 * time.Millisecond,
			Fences: true,
			Corrupt: func(t *testing.T, key idemstore.Key) {
				s.Put(key, idemstore.Record{State: idemstore.StateUnreadable})
			},
		}
	})
}

func TestTTLIsRemainingTime(t *testing.T) {
	s, clock := newStore(t)
	key := idemstore.Key{Operation: "op", Key: "k"}
	if _, ok, err := s.Reserve(t.Context(), key, idemstore.Write{State: idemstore.StatePending, Token: "t", TTL: 10 * time.Second}); err != nil || !ok {
		t.Fatalf("Reserve = %v, %v; want true, nil", ok, err)
	}
	clock.Advance(3 * time.Second)
	if got, want := s.Snapshot(key).TTL, 7*time.Second; got != want {
		t.Fatalf("TTL after 3s of 10s = %v, want %v", got, want)
	}
	clock.Advance(7*time.Second - time.Nanosecond)
	if got, want := s.Snapshot(key).TTL, time.Nanosecond; got != want {
		t.Fatalf("TTL 1ns before expiry = %v, want %v", got, want)
	}
	clock.Advance(time.Nanosecond)
	if got := s.Snapshot(key); got.State != idemstore.StateAbsent {
		t.Fatalf("record at its deadline = %+v, want absent", got)
	}
}

func TestLenCountsLiveKeys(t *testing.T) {
	s, clock := newStore(t)
	ctx := t.Context()
	if got := s.Len(); got != 0 {
		t.Fatalf("Len of a new store = %d, want 0", got)
	}
	for i, ttl := range []time.Duration{time.Second, 2 * time.Second, 3 * time.Second} {
		key := idemstore.Key{Operation: "op", Key: string(rune('a' + i))}
		if _, ok, err := s.Reserve(ctx, key, idemstore.Write{State: idemstore.StatePending, Token: "t", TTL: ttl}); err != nil || !ok {
			t.Fatalf("Reserve(%s) = %v, %v; want true, nil", key, ok, err)
		}
	}
	s.Put(idemstore.Key{Operation: "op", Key: "forever"}, idemstore.Record{State: idemstore.StateUnreadable})
	if got := s.Len(); got != 4 {
		t.Fatalf("Len = %d, want 4", got)
	}
	clock.Advance(2 * time.Second)
	if got := s.Len(); got != 2 {
		t.Fatalf("Len after 2s = %d, want 2 (one key left with a TTL, one without)", got)
	}
	clock.Advance(time.Hour)
	if got := s.Len(); got != 1 {
		t.Fatalf("Len after an hour = %d, want 1 (the key without a TTL)", got)
	}
}

func TestPut(t *testing.T) {
	s, clock := newStore(t)
	key := idemstore.Key{Operation: "op", Key: "k"}
	result := []byte("planted")
	s.Put(key, idemstore.Record{State: idemstore.StatePending, Token: "someone-else", Fingerprint: "fp", TTL: time.Minute})
	s.Put(key, idemstore.Record{State: idemstore.StateCompleted, Token: "tok", Fingerprint: "fp", Result: result, TTL: time.Minute})
	result[0] = 'X'

	got, err := s.Get(t.Context(), key)
	if err != nil {
		t.Fatalf("Get: %v", err)
	}
	if got.State != idemstore.StateCompleted || got.Token != "tok" || got.Fingerprint != "fp" || string(got.Result) != "planted" || got.TTL != time.Minute {
		t.Fatalf("Get after Put = %+v, want the second planted record with TTL 1m", got)
	}

	// A record with no TTL never expires.
	s.Put(key, idemstore.Record{State: idemstore.StateUnreadable})
	clock.Advance(1000 * time.Hour)
	if got := s.Snapshot(key); got.State != idemstore.StateUnreadable || got.TTL != 0 {
		t.Fatalf("Snapshot of a record put without TTL = %+v, want unreadable with TTL 0", got)
	}

	// Putting an absent record deletes the key.
	s.Put(key, idemstore.Record{})
	if got := s.Len(); got != 0 {
		t.Fatalf("Len after putting an absent record = %d, want 0", got)
	}
}

func TestSnapshotIsACopy(t *testing.T) {
	s, _ := newStore(t)
	key := idemstore.Key{Operation: "op", Key: "k"}
	s.Put(key, idemstore.Record{State: idemstore.StateCompleted, Token: "tok", Result: []byte("abc")})
	got := s.Snapshot(key)
	got.Result[0] = 'X'
	if again := s.Snapshot(key); !bytes.Equal(again.Result, []byte("abc")) {
		t.Fatalf("Snapshot after changing an earlier snapshot's result = %q, want %q", again.Result, "abc")
	}
}

func TestPendingWriteDropsResult(t *testing.T) {
	s, _ := newStore(t)
	key := idemstore.Key{Operation: "op", Key: "k"}
	w := idemstore.Write{State: idemstore.StatePending, Token: "t", Result: []byte("stray"), TTL: time.Second}
	if _, ok, err := s.Reserve(t.Context(), key, w); err != nil || !ok {
		t.Fatalf("Reserve = %v, %v; want true, nil", ok, err)
	}
	if got := s.Snapshot(key); got.Result != nil {
		t.Fatalf("Result of a pending record = %q, want nil", got.Result)
	}
}

func TestDoneContext(t *testing.T) {
	s, _ := newStore(t)
	key := idemstore.Key{Operation: "op", Key: "k"}
	ctx, cancel := context.WithCancel(t.Context())
	cancel()

	if _, _, err := s.Reserve(ctx, key, idemstore.Write{State: idemstore.StatePending, Token: "t", TTL: time.Second}); err != context.Canceled {
		t.Errorf("Reserve with a canceled context: error %v, want %v", err, context.Canceled)
	}
	if _, err := s.Get(ctx, key); err != context.Canceled {
		t.Errorf("Get with a canceled context: error %v, want %v", err, context.Canceled)
	}
	if _, err := s.Complete(ctx, key, "t", idemstore.Completion{State: idemstore.StateCompleted, Result: nil, TTL: time.Second}); err != context.Canceled {
		t.Errorf("Complete with a canceled context: error %v, want %v", err, context.Canceled)
	}
	if _, err := s.Release(ctx, key, "t"); err != context.Canceled {
		t.Errorf("Release with a canceled context: error %v, want %v", err, context.Canceled)
	}
	if _, err := s.Renew(ctx, key, "t", time.Second); err != context.Canceled {
		t.Errorf("Renew with a canceled context: error %v, want %v", err, context.Canceled)
	}
	if got := s.Len(); got != 0 {
		t.Errorf("Len after calls with a canceled context = %d, want 0", got)
	}
}

func TestInvalidArguments(t *testing.T) {
	key := idemstore.Key{Operation: "op", Key: "k"}
	tests := []struct {
		name string
		call func(ctx context.Context, s *memstore.Store) error
	}{
		{"ReserveZeroTTL", func(ctx context.Context, s *memstore.Store) error {
			_, _, err := s.Reserve(ctx, key, idemstore.Write{State: idemstore.StatePending, Token: "t"})
			return err
		}},
		{"ReserveNegativeTTL", func(ctx context.Context, s *memstore.Store) error {
			_, _, err := s.Reserve(ctx, key, idemstore.Write{State: idemstore.StateCompleted, Token: "t", TTL: -time.Second})
			return err
		}},
		{"ReserveAbsentState", func(ctx context.Context, s *memstore.Store) error {
			_, _, err := s.Reserve(ctx, key, idemstore.Write{Token: "t", TTL: time.Second})
			return err
		}},
		{"ReserveUnreadableState", func(ctx context.Context, s *memstore.Store) error {
			_, _, err := s.Reserve(ctx, key, idemstore.Write{State: idemstore.StateUnreadable, Token: "t", TTL: time.Second})
			return err
		}},
		{"CompleteZeroTTL", func(ctx context.Context, s *memstore.Store) error {
			_, err := s.Complete(ctx, key, "t", idemstore.Completion{State: idemstore.StateCompleted, Result: nil, TTL: 0})
			return err
		}},
		{"RenewZeroLease", func(ctx context.Context, s *memstore.Store) error {
			_, err := s.Renew(ctx, key, "t", 0)
			return err
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, _ := newStore(t)
			s.Put(key, idemstore.Record{State: idemstore.StatePending, Token: "t", TTL: time.Minute})
			if err := tt.call(t.Context(), s); err == nil {
				t.Fatal("error = nil, want one")
			}
			if got := s.Snapshot(key); got.State != idemstore.StatePending || got.TTL != time.Minute {
				t.Fatalf("record after the refused call = %+v, want it unchanged", got)
			}
		})
	}
}

func TestDefaultClockIsTimeNow(t *testing.T) {
	// In a synctest bubble time.Now is the bubble's fake clock: a store
	// that reads time.Now sees exactly the time the test lets pass.
	synctest.Test(t, func(t *testing.T) {
		for _, s := range []*memstore.Store{memstore.New(), memstore.New(memstore.WithClock(nil))} {
			key := idemstore.Key{Operation: "op", Key: "k"}
			if _, ok, err := s.Reserve(t.Context(), key, idemstore.Write{State: idemstore.StatePending, Token: "t", TTL: time.Millisecond}); err != nil || !ok {
				t.Fatalf("Reserve = %v, %v; want true, nil", ok, err)
			}
			<-time.After(time.Millisecond - time.Nanosecond)
			if got := s.Snapshot(key); got.State != idemstore.StatePending || got.TTL != time.Nanosecond {
				t.Fatalf("record 1ns before its 1ms lease runs out on time.Now = %+v, want pending with 1ns left", got)
			}
			<-time.After(time.Nanosecond)
			if got := s.Snapshot(key); got.State != idemstore.StateAbsent {
				t.Fatalf("record when its 1ms lease ran out on time.Now = %+v, want absent", got)
			}
		}
	})
}

func TestFakeClock(t *testing.T) {
	clock := memstore.NewFakeClock(start)
	if got := clock.Now(); !got.Equal(start) {
		t.Fatalf("Now = %v, want %v", got, start)
	}
	clock.Advance(90 * time.Second)
	if got, want := clock.Now(), start.Add(90*time.Second); !got.Equal(want) {
		t.Fatalf("Now after Advance(90s) = %v, want %v", got, want)
	}
}
