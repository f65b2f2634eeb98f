package coordinator_test

// Regression tests from the engine review: each once failed and showed one
// defect.

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/idemkit/idempotency/coordinator/idemevent"
	"github.com/idemkit/idempotency/coordinator/idemstore"

	"github.com/idemkit/idempotency/coordinator"
	"github.com/idemkit/idempotency/coordinator/faultstore"
	"github.com/idemkit/idempotency/coordinator/memstore"
)

// ---------------------------------------------------------------------------
// 1. A panic while encoding the result escapes Do after the action ran.

// withNilEmbedded is an ordinary result type: encoding/json panics on it when
// the embedded pointer is nil (the promoted MarshalJSON dereferences nil).
type withNilEmbedded struct {
	*time.Time
	ID string `json:"id"`
}

func TestCodecPanicAfterTheActionRanIsNotRaised(t *testing.T) {
	for _, mode := range []coordinator.InFlightMode{coordinator.InFlightWait, coordinator.InFlightRun} {
		t.Run(string(mode), func(t *testing.T) {
			f, _ := newMem(t, coordinator.WithInFlight(mode))
			charged := 0
			action := func(context.Context) (withNilEmbedded, error) {
				charged++ // the effect happens here
				return withNilEmbedded{ID: "ch_1"}, nil
			}
			do := func() (v withNilEmbedded, panicked any, err error) {
				defer func() { panicked = recover() }()
				v, err = coordinator.Do(t.Context(), f.c, call("enc-panic"), action)
				return v, nil, err
			}
			v, p, err := do()
			if p != nil {
				t.Fatalf("Do panicked after the action ran (charged %d): %v; docs/architecture.md, One call, step 8: nothing raises after the action ran", charged, p)
			}
			if err != nil || v.ID != "ch_1" {
				t.Fatalf("Do = %+v, %v", v, err)
			}
			if f.rec.errors(idemevent.ErrorRecordValidation) != 1 {
				t.Fatal("the unencodable result is not reported as record_validation_error")
			}
		})
	}
}

// ---------------------------------------------------------------------------
// 2. A caller that hangs up while Reserve is on the wire leaves its key
// reserved for a whole lease: the client's retry gets ErrInProgress.

// hangUpStore reserves for real, then reports that the caller's context ended
// before the reply arrived: a client that disconnects while the Lua script
// runs.
type hangUpStore struct {
	idemstore.Store
	cancel context.CancelFunc
	armed  bool
}

func (h *hangUpStore) Reserve(ctx context.Context, key idemstore.Key, w idemstore.Write) (idemstore.Record, bool, error) {
	if !h.armed {
		return h.Store.Reserve(ctx, key, w)
	}
	h.armed = false
	rec, ok, err := h.Store.Reserve(context.WithoutCancel(ctx), key, w)
	if err != nil {
		return rec, ok, err
	}
	h.cancel()
	return idemstore.Record{}, false, ctx.Err()
}

func TestHangUpDuringReserveGivesTheKeyBack(t *testing.T) {
	mem := memstore.New()
	ctx, cancel := context.WithCancel(t.Context())
	hs := &hangUpStore{Store: mem, cancel: cancel, armed: true}
	f := newFixture(t, hs, coordinator.WithWaitTimeout(100*time.Millisecond), coordinator.WithPollInterval(time.Millisecond))
	var k counter
	if _, err := coordinator.Do(ctx, f.c, call("hangup"), k.action("x")); !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want context.Canceled", err)
	}
	f.c.Close() // the release runs in the background
	key := idemstore.Key{Operation: "payment.charge", Key: "hangup"}
	if rec := mem.Snapshot(key); rec.State == idemstore.StatePending {
		// The client retries at once.
		_, err := coordinator.Do(t.Context(), f.c, call("hangup"), k.action("retry"))
		t.Fatalf("a caller that hung up left its key reserved (TTL %v, nobody will release it); the retry got %v", rec.TTL, err)
	}
}

// ---------------------------------------------------------------------------
// 3. A Reserve whose reply is lost (a store timeout after Redis ran the
// script) leaves this call's own pending record behind; in mode "run" the
// unprotected result is then never stored, and the key is blocked for a lease.

func TestLostReserveReplyDoesNotBlockTheKey(t *testing.T) {
	for _, mode := range storageModes {
		t.Run(string(mode), func(t *testing.T) {
			f, fs, mem := newFaulty(t, coordinator.WithOnStorageError(mode),
				coordinator.WithWaitTimeout(100*time.Millisecond), coordinator.WithPollInterval(time.Millisecond))
			fs.LoseReplies(idemevent.MethodReserve, 1, context.DeadlineExceeded)
			var k counter
			first, _ := coordinator.Do(t.Context(), f.c, call("lost-reply"), k.action("first"))
			f.c.Close() // a release runs in the background
			key := idemstore.Key{Operation: "payment.charge", Key: "lost-reply"}
			rec := mem.Snapshot(key)
			if rec.State == idemstore.StatePending {
				second, err := coordinator.Do(t.Context(), f.c, call("lost-reply"), k.action("second"))
				t.Fatalf("after a lost Reserve reply the key holds this call's own pending record (TTL %v) "+
					"and nothing removes or completes it; first=%+v, next call = %+v, %v", rec.TTL, first, second, err)
			}
		})
	}
}

// ---------------------------------------------------------------------------
// 4. The lease is passed to the Store as it was configured, not as a whole
// number of milliseconds as the Store contract promises.

type msStrict struct{ idemstore.Store }

func checkMS(d time.Duration) error {
	if d%time.Millisecond != 0 {
		return fmt.Errorf("strict store: TTL %v is not a whole number of milliseconds", d)
	}
	return nil
}

func (s msStrict) Reserve(ctx context.Context, key idemstore.Key, w idemstore.Write) (idemstore.Record, bool, error) {
	if err := checkMS(w.TTL); err != nil {
		return idemstore.Record{}, false, err
	}
	return s.Store.Reserve(ctx, key, w)
}

func (s msStrict) Renew(ctx context.Context, key idemstore.Key, token string, lease time.Duration) (bool, error) {
	if err := checkMS(lease); err != nil {
		return false, err
	}
	return s.Store.Renew(ctx, key, token, lease)
}

func TestStoreGetsWholeMilliseconds(t *testing.T) {
	// On the fake clock the action outlasts one renew interval (a third of
	// the lease, 10s), so that a renewal's lease is checked too.
	synctest.Test(t, func(t *testing.T) {
		f := newFixture(t, msStrict{memstore.New()}, coordinator.WithLease(30*time.Second+500*time.Microsecond))
		var k counter
		if _, err := coordinator.Do(t.Context(), f.c, call("ms"), func(ctx context.Context) (charge, error) {
			<-time.After(11 * time.Second)
			return k.action("x")(ctx)
		}); err != nil {
			t.Fatal(err)
		}
		for _, e := range f.rec.all() {
			if e.Kind == idemevent.Error {
				t.Fatalf("the coordinator sent a TTL that breaks the Store contract: %v", e.Err)
			}
		}
		if got := f.rec.calls(idemevent.MethodRenew); got != 1 {
			t.Fatalf("%d renewals, want 1", got)
		}
	})
}

// ---------------------------------------------------------------------------
// 6. A cancelled waiter does not return at once: the last waiter to leave a
// poll loop blocks until the loop's in-flight Get returns. go-redis bounds a
// read by the context's deadline only (the storage timeout), never by its
// cancellation, so a client that hangs up is held for up to a storage
// timeout.

// deadlineOnlyStore answers Get like go-redis on a slow Redis: the call ends
// at its context's deadline, and cancellation does not cut it short.
type deadlineOnlyStore struct {
	*memstore.Store
	slow    chan struct{} // closed: Get is slow from now on
	entered chan struct{}
	once    sync.Once
}

func (s *deadlineOnlyStore) Get(ctx context.Context, key idemstore.Key) (idemstore.Record, error) {
	select {
	case <-s.slow:
	default:
		return s.Store.Get(ctx, key)
	}
	s.once.Do(func() { close(s.entered) })
	d, ok := ctx.Deadline()
	if !ok {
		return s.Store.Get(ctx, key)
	}
	<-time.After(time.Until(d)) // run in a synctest bubble: on the fake clock
	return idemstore.Record{}, context.DeadlineExceeded
}

func TestCancelledWaiterIsNotHeldByASlowPoll(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := &deadlineOnlyStore{Store: memstore.New(), slow: make(chan struct{}), entered: make(chan struct{})}
		f := newFixture(t, s, coordinator.WithPollInterval(time.Millisecond), coordinator.WithStorageTimeout(500*time.Millisecond))
		release := make(chan struct{})
		done := holder(t, f.c, "held", release, charge{ID: "first"}, nil)
		defer func() { close(release); <-done }()
		ctx, cancel := context.WithCancel(t.Context())
		errc := make(chan error, 1)
		go func() {
			_, err := coordinator.Do(ctx, f.c, call("held"), (&counter{}).action("x"))
			errc <- err
		}()
		synctest.Wait()
		if n := f.rec.count(idemevent.InFlight, ""); n != 1 {
			t.Fatalf("in-flight events = %d, want 1: the waiter waits", n)
		}
		close(s.slow)
		<-s.entered // the shared poll's Get is on the wire, until 501ms
		start := time.Now()
		cancel()
		err := <-errc
		if d := time.Since(start); d != 0 {
			t.Fatalf("a cancelled waiter returned %v after cancel (err %v); docs: \"A cancelled ctx returns at once\"", d, err)
		}
	})
}

func TestCloseWaitsForPollLoops(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const timeout = 200 * time.Millisecond
		s := &deadlineOnlyStore{Store: memstore.New(), slow: make(chan struct{}), entered: make(chan struct{})}
		f := newFixture(t, s, coordinator.WithPollInterval(time.Millisecond), coordinator.WithStorageTimeout(timeout))
		release := make(chan struct{})
		done := holder(t, f.c, "close", release, charge{ID: "first"}, nil)
		ctx, cancel := context.WithCancel(t.Context())
		errc := make(chan error, 1)
		go func() {
			_, err := coordinator.Do(ctx, f.c, call("close"), (&counter{}).action("x"))
			errc <- err
		}()
		synctest.Wait()
		if n := f.rec.count(idemevent.InFlight, ""); n != 1 {
			t.Fatalf("in-flight events = %d, want 1: the waiter waits", n)
		}
		close(s.slow)
		<-s.entered // the loop's read, at 1ms, runs until its deadline at 201ms
		cancel()
		<-errc
		start := time.Now()
		if err := f.c.Close(); err != nil {
			t.Fatal(err)
		}
		if d := time.Since(start); d != timeout {
			t.Fatalf("Close returned after %v, want %v: when the slow read in flight ended", d, timeout)
		}
		close(release)
		<-done
	})
}

// Shutdown is Close bounded by its context: a save that keeps failing is
// given up waiting for when the context ends, and waited for again, to its
// end, once the store answers.
func TestShutdownStopsWaitingWhenItsContextEnds(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		fs := faultstore.Wrap(memstore.New())
		f := newFixture(t, fs, coordinator.WithLease(3*time.Second))
		fs.Fail(idemevent.MethodComplete, nil)
		if _, err := coordinator.Do(t.Context(), f.c, call("k"), (&counter{}).action("r")); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		start := time.Now()
		err := f.c.Shutdown(ctx)
		if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "1 background tasks") {
			t.Fatalf("Shutdown = %v, want the save still running and the deadline", err)
		}
		if d := time.Since(start); d != time.Second {
			t.Fatalf("Shutdown returned after %v, want 1s: its context's deadline", d)
		}
		fs.Reset()
		if err := f.c.Shutdown(context.Background()); err != nil {
			t.Fatal(err)
		}
		if rec, err := fs.Get(context.Background(), idemstore.Key{Operation: "payment.charge", Key: "k"}); err != nil || rec.State != idemstore.StateCompleted {
			t.Fatalf("k holds %+v (%v), want the save completed", rec, err)
		}
	})
}
