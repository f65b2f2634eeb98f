package coordinator_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/idemkit/idempotency/internal/unprotected"

	"github.com/idemkit/idempotency/coordinator/idemevent"
	"github.com/idemkit/idempotency/coordinator/idemstore"

	"github.com/idemkit/idempotency/coordinator"
)

func TestFirstCallRunsLaterCallsReplay(t *testing.T) {
	f, _ := newMem(t)
	var k counter
	first, err := coordinator.Do(t.Context(), f.c, call("k1"), k.action("ch_1"))
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		again, err := coordinator.Do(t.Context(), f.c, call("k1"), k.action("ch_other"))
		if err != nil {
			t.Fatal(err)
		}
		if again != first {
			t.Fatalf("replay = %+v, want %+v", again, first)
		}
	}
	if k.n() != 1 {
		t.Fatalf("action ran %d times, want 1", k.n())
	}
	if got := f.rec.count(idemevent.Hit, ""); got != 3 {
		t.Fatalf("hits = %d, want 3", got)
	}
	if got := f.rec.count(idemevent.Miss, ""); got != 1 {
		t.Fatalf("misses = %d, want 1", got)
	}
	if got := f.rec.count(idemevent.Stored, ""); got != 1 {
		t.Fatalf("stored = %d, want 1", got)
	}
}

func TestZeroValueAndNullAreReplayed(t *testing.T) {
	f, _ := newMem(t)
	runs := 0
	nilPtr := func(context.Context) (*charge, error) { runs++; return nil, nil }
	for range 2 {
		v, err := coordinator.Do(t.Context(), f.c, call("null"), nilPtr)
		if err != nil || v != nil {
			t.Fatalf("Do = %v, %v; want nil, nil", v, err)
		}
	}
	zero := func(context.Context) (int, error) { runs++; return 0, nil }
	for range 2 {
		v, err := coordinator.Do(t.Context(), f.c, coordinator.Call{Operation: "count", Key: "zero"}, zero)
		if err != nil || v != 0 {
			t.Fatalf("Do = %v, %v; want 0, nil", v, err)
		}
	}
	if runs != 2 {
		t.Fatalf("actions ran %d times, want 2 (one per key)", runs)
	}
	if got := f.rec.count(idemevent.Hit, ""); got != 2 {
		t.Fatalf("hits = %d, want 2", got)
	}
}

func TestExecuteReportsReplay(t *testing.T) {
	f, _ := newMem(t)
	action := func(context.Context) ([]byte, error) { return []byte(`{"ok":true}`), nil }
	r1, err := f.c.Execute(t.Context(), call("x"), action)
	if err != nil || r1.Replayed || string(r1.Value) != `{"ok":true}` {
		t.Fatalf("first = %+v, %v", r1, err)
	}
	r2, err := f.c.Execute(t.Context(), call("x"), action)
	if err != nil || !r2.Replayed || string(r2.Value) != `{"ok":true}` {
		t.Fatalf("second = %+v, %v", r2, err)
	}
}

func TestKeyReuseIsRefused(t *testing.T) {
	f, s := newMem(t)
	var k counter
	c1 := call("reuse")
	c1.Fingerprint = "fp-a"
	if _, err := coordinator.Do(t.Context(), f.c, c1, k.action("a")); err != nil {
		t.Fatal(err)
	}
	c2 := c1
	c2.Fingerprint = "fp-b"
	_, err := coordinator.Do(t.Context(), f.c, c2, k.action("b"))
	var kr *coordinator.KeyReuseError
	if !errors.Is(err, coordinator.ErrKeyReuse) || !errors.As(err, &kr) {
		t.Fatalf("err = %v, want ErrKeyReuse", err)
	}
	if kr.Stored != "fp-a" || kr.Got != "fp-b" || kr.Key != "reuse" {
		t.Fatalf("KeyReuseError = %+v", kr)
	}
	// Without a fingerprint on either side there is nothing to compare.
	if _, err := coordinator.Do(t.Context(), f.c, call("reuse"), k.action("c")); err != nil {
		t.Fatalf("no fingerprint: %v", err)
	}
	if k.n() != 1 {
		t.Fatalf("action ran %d times, want 1", k.n())
	}
	if got := f.rec.errors(idemevent.ErrorKeyReuse); got != 1 {
		t.Fatalf("key_reuse = %d, want 1", got)
	}
	if rec := s.Snapshot(idemstore.Key{Operation: "payment.charge", Key: "reuse"}); rec.Fingerprint != "fp-a" {
		t.Fatalf("stored record changed: %+v", rec)
	}
}

func TestKeyReuseWhilePending(t *testing.T) {
	f, s := newMem(t)
	key := idemstore.Key{Operation: "payment.charge", Key: "p"}
	s.Put(key, idemstore.Record{State: idemstore.StatePending, Token: "other", Fingerprint: "fp-a", TTL: time.Minute})
	var k counter
	c := call("p")
	c.Fingerprint = "fp-b"
	if _, err := coordinator.Do(t.Context(), f.c, c, k.action("x")); !errors.Is(err, coordinator.ErrKeyReuse) {
		t.Fatalf("err = %v, want ErrKeyReuse", err)
	}
	if k.n() != 0 {
		t.Fatal("action ran")
	}
}

func TestEmptyKeyIsInvalid(t *testing.T) {
	// A key lost on its way (an empty header or message ID) must not turn
	// the protection off silently.
	for _, mode := range []coordinator.InFlightMode{coordinator.InFlightWait, coordinator.InFlightRaise, coordinator.InFlightRun} {
		f, s := newMem(t, coordinator.WithInFlight(mode))
		var k counter
		_, err := coordinator.Do(t.Context(), f.c, call(""), k.action("x"))
		var ir *coordinator.InvalidRequestError
		if !errors.As(err, &ir) || ir.Reason != "key is empty" {
			t.Fatalf("%s: err = %v, want ErrInvalidRequest: key is empty", mode, err)
		}
		if k.n() != 0 || s.Len() != 0 || len(f.rec.all()) != 0 {
			t.Fatalf("%s: runs=%d stored=%d events=%d, want 0, 0, 0", mode, k.n(), s.Len(), len(f.rec.all()))
		}
	}
}

func TestKillSwitch(t *testing.T) {
	f, s := newMem(t, coordinator.WithEnabled(false))
	var k counter
	for range 3 {
		if _, err := coordinator.Do(t.Context(), f.c, call("k"), k.action("x")); err != nil {
			t.Fatal(err)
		}
	}
	if k.n() != 3 || s.Len() != 0 || len(f.rec.all()) != 0 {
		t.Fatalf("runs=%d stored=%d events=%d, want 3, 0, 0", k.n(), s.Len(), len(f.rec.all()))
	}
	if f.c.Enabled() {
		t.Fatal("Enabled() = true")
	}
}

func TestInvalidCallsNeverTouchTheStore(t *testing.T) {
	long := strings.Repeat("k", coordinator.MaxKeyLen+1)
	tests := []struct {
		name string
		call coordinator.Call
	}{
		{"empty operation", coordinator.Call{Key: "k"}},
		{"operation with colon", coordinator.Call{Operation: "pay:charge", Key: "k"}},
		{"operation with space", coordinator.Call{Operation: "pay charge", Key: "k"}},
		{"operation too long", coordinator.Call{Operation: strings.Repeat("o", coordinator.MaxOperationLen+1), Key: "k"}},
		{"key too long", coordinator.Call{Operation: "op", Key: long}},
		{"key with space", coordinator.Call{Operation: "op", Key: "a b"}},
		{"key padded", coordinator.Call{Operation: "op", Key: " k"}},
		{"key with newline", coordinator.Call{Operation: "op", Key: "k\n"}},
		{"key with DEL", coordinator.Call{Operation: "op", Key: "k\x7f"}},
		{"key not ASCII", coordinator.Call{Operation: "op", Key: "clé"}},
		{"negative TTL", coordinator.Call{Operation: "op", Key: "k", TTL: -time.Second}},
		{"TTL below min", coordinator.Call{Operation: "op", Key: "k", TTL: 500 * time.Millisecond}},
		{"TTL above max", coordinator.Call{Operation: "op", Key: "k", TTL: 31 * 24 * time.Hour}},
		{"fingerprint with space", coordinator.Call{Operation: "op", Key: "k", Fingerprint: "a b"}},
		{"fingerprint too long", coordinator.Call{Operation: "op", Key: "k", Fingerprint: strings.Repeat("f", coordinator.MaxFingerprintLen+1)}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for _, enabled := range []bool{true, false} {
				f, s := newMem(t, coordinator.WithEnabled(enabled))
				var k counter
				_, err := coordinator.Do(t.Context(), f.c, tt.call, k.action("x"))
				var ir *coordinator.InvalidRequestError
				if !errors.Is(err, coordinator.ErrInvalidRequest) || !errors.As(err, &ir) ||
					err.Error() != "idempotency: invalid request: "+ir.Reason || ir.Reason == "" {
					t.Fatalf("enabled=%v: err = %v, want an *InvalidRequestError matching ErrInvalidRequest", enabled, err)
				}
				if k.n() != 0 || s.Len() != 0 || len(f.rec.all()) != 0 {
					t.Fatalf("enabled=%v: runs=%d stored=%d events=%d, want 0, 0, 0", enabled, k.n(), s.Len(), len(f.rec.all()))
				}
			}
		})
	}
}

func TestNilActionIsInvalid(t *testing.T) {
	for _, enabled := range []bool{true, false} {
		f, s := newMem(t, coordinator.WithEnabled(enabled))
		call := coordinator.Call{Operation: "op", Key: "k"}
		_, err := coordinator.Do[string](t.Context(), f.c, call, nil)
		if !errors.Is(err, coordinator.ErrInvalidRequest) || !strings.Contains(err.Error(), "action is nil") {
			t.Fatalf("enabled=%v: Do(nil) err = %v, want ErrInvalidRequest: action is nil", enabled, err)
		}
		if _, err := f.c.Execute(t.Context(), call, nil); !errors.Is(err, coordinator.ErrInvalidRequest) {
			t.Fatalf("enabled=%v: Execute(nil) err = %v, want ErrInvalidRequest", enabled, err)
		}
		var k counter
		_, err = coordinator.DoWithCodec(t.Context(), f.c, call, nil, k.action("x"))
		var ir *coordinator.InvalidRequestError
		if !errors.As(err, &ir) || ir.Reason != "codec is nil" || k.n() != 0 {
			t.Fatalf("enabled=%v: DoWithCodec(nil codec) err = %v after %d runs, want the reason \"codec is nil\" and no run", enabled, err, k.n())
		}
		if s.Len() != 0 || len(f.rec.all()) != 0 {
			t.Fatalf("enabled=%v: stored=%d events=%d, want 0, 0", enabled, s.Len(), len(f.rec.all()))
		}
	}
}

func TestLimitsAreInclusive(t *testing.T) {
	f, _ := newMem(t)
	var visible strings.Builder
	for c := byte(0x21); c <= 0x7e; c++ {
		visible.WriteByte(c)
	}
	calls := []coordinator.Call{
		{Operation: strings.Repeat("o", coordinator.MaxOperationLen), Key: strings.Repeat("k", coordinator.MaxKeyLen)},
		{Operation: "Az09._-", Key: visible.String()},
		{Operation: "op", Key: "k", TTL: time.Second},
		{Operation: "op", Key: "k2", TTL: 30 * 24 * time.Hour},
	}
	for _, c := range calls {
		var k counter
		if _, err := coordinator.Do(t.Context(), f.c, c, k.action("x")); err != nil {
			t.Errorf("%+v: %v", c, err)
		}
	}
}

func TestTTLResolution(t *testing.T) {
	// On the fake clock no time passes between Complete and the snapshot:
	// the TTL read back is the one written.
	synctest.Test(t, func(t *testing.T) {
		f, s := newMem(t,
			coordinator.WithDefaultTTL(2*time.Hour),
			coordinator.WithOperationTTLs(map[string]time.Duration{"order.create": 3 * time.Hour}))
		var k counter
		tests := []struct {
			call coordinator.Call
			want time.Duration
		}{
			{coordinator.Call{Operation: "payment.charge", Key: "default"}, 2 * time.Hour},
			{coordinator.Call{Operation: "order.create", Key: "op"}, 3 * time.Hour},
			// The operator's TTL for the operation wins over the call's.
			{coordinator.Call{Operation: "order.create", Key: "call", TTL: time.Minute}, 3 * time.Hour},
			// The call's TTL wins over the default, rounded down to the
			// millisecond.
			{coordinator.Call{Operation: "payment.charge", Key: "call", TTL: 90*time.Second + 1500*time.Microsecond}, 90*time.Second + time.Millisecond},
		}
		for _, tt := range tests {
			if _, err := coordinator.Do(t.Context(), f.c, tt.call, k.action("x")); err != nil {
				t.Fatal(err)
			}
			rec := s.Snapshot(idemstore.Key{Operation: tt.call.Operation, Key: tt.call.Key})
			if rec.State != idemstore.StateCompleted || rec.TTL != tt.want {
				t.Errorf("%s: record %v with TTL %v, want completed with %v", tt.call.Key, rec.State, rec.TTL, tt.want)
			}
		}
	})
}

func TestActionErrorIsNotCachedAndReleases(t *testing.T) {
	f, s := newMem(t)
	boom := errors.New("provider down")
	_, err := coordinator.Do(t.Context(), f.c, call("e"), func(context.Context) (charge, error) { return charge{}, boom })
	if err != boom { // unchanged, not wrapped
		t.Fatalf("err = %v, want the action's own error", err)
	}
	if s.Len() != 0 {
		t.Fatal("reservation not released")
	}
	var k counter
	if _, err := coordinator.Do(t.Context(), f.c, call("e"), k.action("x")); err != nil || k.n() != 1 {
		t.Fatalf("retry: err=%v runs=%d", err, k.n())
	}
}

func TestPanicReleasesAndPropagates(t *testing.T) {
	f, s := newMem(t)
	func() {
		defer func() {
			if r := recover(); r != "kaboom" {
				t.Fatalf("recovered %v, want kaboom", r)
			}
		}()
		_, _ = coordinator.Do(t.Context(), f.c, call("panic"), func(context.Context) (int, error) { panic("kaboom") })
		t.Fatal("Do returned")
	}()
	if s.Len() != 0 {
		t.Fatal("reservation not released after panic")
	}
	var k counter
	if _, err := coordinator.Do(t.Context(), f.c, call("panic"), k.action("x")); err != nil || k.n() != 1 {
		t.Fatalf("retry: err=%v runs=%d", err, k.n())
	}
}

func TestUnreadableRecordHeals(t *testing.T) {
	for _, mode := range []coordinator.InFlightMode{coordinator.InFlightWait, coordinator.InFlightRaise, coordinator.InFlightRun} {
		for _, storageMode := range []coordinator.OnStorageErrorMode{coordinator.OnStorageErrorRun, coordinator.OnStorageErrorRaise} {
			t.Run(string(mode)+"/"+string(storageMode), func(t *testing.T) {
				f, s := newMem(t, coordinator.WithInFlight(mode), coordinator.WithOnStorageError(storageMode))
				corrupt := idemstore.Key{Operation: "payment.charge", Key: "corrupt"}
				s.Put(corrupt, idemstore.Record{State: idemstore.StateUnreadable, TTL: time.Hour})
				undecodable := idemstore.Key{Operation: "payment.charge", Key: "undecodable"}
				s.Put(undecodable, idemstore.Record{State: idemstore.StateCompleted, Token: "old", Result: []byte(`"not a charge"`), TTL: time.Hour})
				for _, key := range []idemstore.Key{corrupt, undecodable} {
					var k counter
					got, err := coordinator.Do(t.Context(), f.c, call(key.Key), k.action("fresh"))
					if err != nil || got.ID != "fresh" || k.n() != 1 {
						t.Fatalf("%s: Do = %+v, %v after %d runs", key.Key, got, err, k.n())
					}
					again, err := coordinator.Do(t.Context(), f.c, call(key.Key), k.action("again"))
					if err != nil || again != got || k.n() != 1 {
						t.Fatalf("%s: after heal Do = %+v, %v after %d runs; want a replay", key.Key, again, err, k.n())
					}
				}
				if got := f.rec.errors(idemevent.ErrorDecode); got != 2 {
					t.Fatalf("decode_error = %d, want 2", got)
				}
			})
		}
	}
}

func TestConcurrentHealersRunOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const runFor = 20 * time.Millisecond
		f, s := newMem(t)
		key := idemstore.Key{Operation: "payment.charge", Key: "heal"}
		s.Put(key, idemstore.Record{State: idemstore.StateUnreadable, TTL: time.Hour})
		var k counter
		slow := func(ctx context.Context) (charge, error) {
			<-time.After(runFor)
			return k.action("healed")(ctx)
		}
		results := make([]charge, 16)
		var wg sync.WaitGroup
		for i := range results {
			wg.Go(func() {
				v, err := coordinator.Do(t.Context(), f.c, call("heal"), slow)
				if err != nil {
					t.Error(err)
				}
				results[i] = v
			})
		}
		wg.Wait()
		if k.n() != 1 {
			t.Fatalf("action ran %d times, want 1", k.n())
		}
		for _, r := range results {
			if r != results[0] {
				t.Fatalf("results differ: %+v vs %+v", r, results[0])
			}
		}
		// Every healer tried before the winner's action ended (the fake
		// clock stood still until all of them were waiting); the other 15
		// waited for it, and replay its result.
		wantWaits(t, f.rec, len(results)-1, idemevent.WaitHit, runFor)
	})
}

func TestLeaseIsInTheActionContext(t *testing.T) {
	f, _ := newMem(t)
	var lease coordinator.Reservation
	var ok bool
	_, err := coordinator.Do(t.Context(), f.c, call("lease"), func(ctx context.Context) (int, error) {
		lease, ok = coordinator.ReservationFromContext(ctx)
		return 1, nil
	})
	if err != nil || !ok || len(lease.Token) != 16 || lease.Key != "lease" {
		t.Fatalf("lease = %+v, %v, %v", lease, ok, err)
	}
	_, ok = coordinator.ReservationFromContext(t.Context())
	if ok {
		t.Fatal("lease outside an action")
	}
}

func TestReportUnprotected(t *testing.T) {
	f, s := newMem(t)
	unprotected.Report(f.c, t.Context(), "payment.charge")
	unprotected.Report(f.c, t.Context(), "not valid") // not an operation: ignored
	events := f.rec.all()
	if len(events) != 1 || events[0].Kind != idemevent.Unprotected || events[0].Method != idemevent.MethodNone ||
		events[0].Key != (idemstore.Key{Operation: "payment.charge"}) || s.Len() != 0 {
		t.Fatalf("events = %+v, stored %d; want one unprotected{none} and no store call", events, s.Len())
	}
	off, _ := newMem(t, coordinator.WithEnabled(false))
	unprotected.Report(off.c, t.Context(), "payment.charge")
	if n := len(off.rec.all()); n != 0 {
		t.Fatalf("kill switch off: %d events, want 0", n)
	}
}
