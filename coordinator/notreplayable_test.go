package coordinator_test

import (
	"context"
	"errors"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/idemkit/idempotency/coordinator/idemevent"
	"github.com/idemkit/idempotency/coordinator/idemstore"

	"github.com/idemkit/idempotency/coordinator"
)

// panicking is a codec whose encoder panics.
type panicking struct{ coordinator.JSONCodec[any] }

func (panicking) Encode(any) ([]byte, error) { panic("encoder bug") }

// unstorable is a result that cannot be kept, and the reason the
// not-replayable record gives for it.
type unstorable struct {
	name   string
	value  any
	codec  coordinator.Codec[any]
	reason string
}

func unstorables() []unstorable {
	return []unstorable{
		{"too large", strings.Repeat("x", 64), coordinator.JSONCodec[any]{}, "the result is 66 bytes, more than the limit of 32"},
		{"NaN", math.NaN(), coordinator.JSONCodec[any]{}, "the result cannot be encoded: json: unsupported value: NaN"},
		{"chan", struct{ C chan int }{make(chan int)}, coordinator.JSONCodec[any]{}, "the result cannot be encoded: json: unsupported type: chan int"},
		{"encoder panic", 1, panicking{}, "the result cannot be encoded: codec panicked: encoder bug"},
	}
}

var inFlightModes = []coordinator.InFlightMode{coordinator.InFlightWait, coordinator.InFlightRaise, coordinator.InFlightRun}

// An action whose result cannot be kept runs once: every later call with the
// key gets ErrNotReplayable with the reason, in every in-flight mode.
func TestUnstorableResultRunsOnce(t *testing.T) {
	for _, u := range unstorables() {
		for _, mode := range inFlightModes {
			t.Run(u.name+"/"+string(mode), func(t *testing.T) {
				f, s := newMem(t, coordinator.WithMaxResultBytes(32), coordinator.WithInFlight(mode))
				var runs atomic.Int64
				action := func(context.Context) (any, error) { runs.Add(1); return u.value, nil }
				v, err := coordinator.DoWithCodec(t.Context(), f.c, call("k"), u.codec, action)
				if err != nil || v.Replayed {
					t.Fatalf("first call: %+v, %v; want the action's own result", v, err)
				}
				rec := s.Snapshot(idemstore.Key{Operation: "payment.charge", Key: "k"})
				if rec.State != idemstore.StateNotReplayable || string(rec.Result) != u.reason {
					t.Fatalf("record = %s %q, want not_replayable %q", rec.State, rec.Result, u.reason)
				}
				for range 2 {
					_, err = coordinator.DoWithCodec(t.Context(), f.c, call("k"), u.codec, action)
					var nr *coordinator.NotReplayableError
					if !errors.Is(err, coordinator.ErrNotReplayable) || !errors.As(err, &nr) || nr.Reason != u.reason || nr.Key != "k" {
						t.Fatalf("later call: %v, want ErrNotReplayable with reason %q", err, u.reason)
					}
				}
				if runs.Load() != 1 {
					t.Fatalf("the action ran %d times, want 1", runs.Load())
				}
				if got := f.rec.errors(idemevent.ErrorRecordValidation); got != 1 {
					t.Fatalf("record_validation_error = %d, want 1", got)
				}
				if got := f.rec.count(idemevent.NotReplayable, ""); got != 2 {
					t.Fatalf("not_replayable events = %d, want 2", got)
				}
			})
		}
	}
}

// Ten calls at once with one key: the action runs once. In mode "run" a
// call makes no reservation, so ten first calls at once may all run, as they
// may for a result that can be kept; ten calls after the first completed do
// not.
func TestUnstorableResultRunsOnceConcurrently(t *testing.T) {
	for _, u := range unstorables() {
		for _, mode := range inFlightModes {
			t.Run(u.name+"/"+string(mode), func(t *testing.T) {
				f, _ := newMem(t, coordinator.WithMaxResultBytes(32), coordinator.WithInFlight(mode))
				var runs atomic.Int64
				started := make(chan struct{})
				var once sync.Once
				release := make(chan struct{})
				action := func(context.Context) (any, error) {
					runs.Add(1)
					once.Do(func() { close(started) })
					<-release
					return u.value, nil
				}
				if mode == coordinator.InFlightRun {
					close(release) // first call completes before the ten
					if _, err := coordinator.DoWithCodec(t.Context(), f.c, call("k"), u.codec, action); err != nil {
						t.Fatal(err)
					}
				}
				var wg sync.WaitGroup
				errs := make([]error, 10)
				for i := range errs {
					wg.Go(func() {
						_, errs[i] = coordinator.DoWithCodec(t.Context(), f.c, call("k"), u.codec, action)
					})
				}
				if mode != coordinator.InFlightRun {
					<-started
					close(release)
				}
				wg.Wait()
				if runs.Load() != 1 {
					t.Fatalf("the action ran %d times, want 1", runs.Load())
				}
				for i, err := range errs {
					switch {
					case err == nil, errors.Is(err, coordinator.ErrNotReplayable):
					case mode == coordinator.InFlightRaise && errors.Is(err, coordinator.ErrInProgress):
					default:
						t.Errorf("call %d: %v", i, err)
					}
				}
				// Every call after them is refused, never run.
				if _, err := coordinator.DoWithCodec(t.Context(), f.c, call("k"), u.codec, action); !errors.Is(err, coordinator.ErrNotReplayable) {
					t.Fatalf("after: %v, want ErrNotReplayable", err)
				}
			})
		}
	}
}

// A key reused for another request still gets ErrKeyReuse, not the
// not-replayable error.
func TestNotReplayableKeyReuse(t *testing.T) {
	f, _ := newMem(t, coordinator.WithMaxResultBytes(8))
	c := call("k")
	c.Fingerprint = "fp-a"
	big := func(context.Context) (string, error) { return strings.Repeat("x", 64), nil }
	if _, err := coordinator.Do(t.Context(), f.c, c, big); err != nil {
		t.Fatal(err)
	}
	c.Fingerprint = "fp-b"
	if _, err := coordinator.Do(t.Context(), f.c, c, big); !errors.Is(err, coordinator.ErrKeyReuse) {
		t.Fatalf("reuse: %v, want ErrKeyReuse", err)
	}
}

// An unprotected run (the store failed, mode "run") whose result cannot be
// kept writes the not-replayable record afterwards, as it would a result.
func TestUnstorableUnprotectedRunIsKept(t *testing.T) {
	f, fs, _ := newFaulty(t, coordinator.WithMaxResultBytes(8))
	fs.FailOnce(idemevent.MethodReserve, errConnRefused)
	var runs atomic.Int64
	big := func(context.Context) (string, error) { runs.Add(1); return strings.Repeat("x", 64), nil }
	if _, err := coordinator.Do(t.Context(), f.c, call("k"), big); err != nil {
		t.Fatal(err)
	}
	f.c.Close() // waits for the background write
	if n := f.rec.count(idemevent.Unprotected, ""); n != 1 {
		t.Fatalf("unprotected = %d, want 1", n)
	}
	f2 := newFixture(t, fs)
	if _, err := coordinator.Do(t.Context(), f2.c, call("k"), big); !errors.Is(err, coordinator.ErrNotReplayable) || runs.Load() != 1 {
		t.Fatalf("later call: %v after %d runs, want ErrNotReplayable after 1", err, runs.Load())
	}
}
