package coordinator_test

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"testing"
	"testing/synctest"

	"github.com/idemkit/idempotency/coordinator/idemevent"
	"github.com/idemkit/idempotency/coordinator/idemstore"

	"github.com/idemkit/idempotency/coordinator"
)

// Result.Replayed tells a replay from this call's own run on every path of
// the flow; Do, DoResult, DoWithCodec and Execute share one.
func TestDoResultReportsReplayOnEveryPath(t *testing.T) {
	replayed := func(t *testing.T, res coordinator.Result[charge], err error, want bool, id string) {
		t.Helper()
		if err != nil || res.Replayed != want || res.Value.ID != id {
			t.Fatalf("DoResult = %+v, %v; want Replayed %v with %q", res, err, want, id)
		}
	}

	t.Run("first run and retry", func(t *testing.T) {
		f, _ := newMem(t)
		var k counter
		res, err := coordinator.DoResult(t.Context(), f.c, call("k"), k.action("ch_1"))
		replayed(t, res, err, false, "ch_1")
		res, err = coordinator.DoResult(t.Context(), f.c, call("k"), k.action("ch_2"))
		replayed(t, res, err, true, "ch_1")
		if k.n() != 1 {
			t.Fatalf("runs = %d, want 1", k.n())
		}
	})

	t.Run("a waiter gets the holder's result as a replay", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			f, _ := newMem(t)
			release := make(chan struct{})
			var wg sync.WaitGroup
			wg.Go(func() {
				res, err := coordinator.DoResult(t.Context(), f.c, call("w"), func(context.Context) (charge, error) {
					<-release
					return charge{ID: "holder"}, nil
				})
				replayed(t, res, err, false, "holder")
			})
			synctest.Wait() // the holder has reserved and runs
			var k counter
			var res coordinator.Result[charge]
			var err error
			wg.Go(func() { res, err = coordinator.DoResult(t.Context(), f.c, call("w"), k.action("waiter")) })
			synctest.Wait() // the waiter waits
			close(release)
			wg.Wait()
			replayed(t, res, err, true, "holder")
			if k.n() != 0 {
				t.Fatalf("the waiter ran its action %d times", k.n())
			}
		})
	})

	t.Run("run mode adopts a concurrent result as a replay", func(t *testing.T) {
		f, _ := newMem(t, coordinator.WithInFlight(coordinator.InFlightRun))
		var k counter
		res, err := coordinator.DoResult(t.Context(), f.c, call("r"), func(ctx context.Context) (charge, error) {
			// A concurrent caller completes first.
			if _, err := coordinator.Do(ctx, f.c, call("r"), k.action("winner")); err != nil {
				return charge{}, err
			}
			return charge{ID: "loser"}, nil
		})
		replayed(t, res, err, true, "winner")
	})

	t.Run("an unprotected run is not a replay", func(t *testing.T) {
		f, fs, _ := newFaulty(t)
		fs.FailOnce(idemevent.MethodReserve, errConnRefused)
		var k counter
		res, err := coordinator.DoResult(t.Context(), f.c, call("u"), k.action("unprotected"))
		replayed(t, res, err, false, "unprotected")
	})

	t.Run("the kill switch never replays", func(t *testing.T) {
		f, _ := newMem(t, coordinator.WithEnabled(false))
		var k counter
		for range 2 {
			res, err := coordinator.DoResult(t.Context(), f.c, call("off"), k.action("off"))
			replayed(t, res, err, false, "off")
		}
		if k.n() != 2 {
			t.Fatalf("runs = %d, want 2", k.n())
		}
	})

	t.Run("a failed action returns its own value and error", func(t *testing.T) {
		f, _ := newMem(t)
		boom := errors.New("boom")
		res, err := coordinator.DoResult(t.Context(), f.c, call("e"), func(context.Context) (charge, error) {
			return charge{ID: "partial"}, boom
		})
		if !errors.Is(err, boom) || res.Replayed || res.Value.ID != "partial" {
			t.Fatalf("DoResult = %+v, %v; want the action's own value and error", res, err)
		}
		v, err := coordinator.Do(t.Context(), f.c, call("e2"), func(context.Context) (charge, error) {
			return charge{ID: "partial"}, boom
		})
		if !errors.Is(err, boom) || v.ID != "partial" {
			t.Fatalf("Do = %+v, %v; want the action's own value and error", v, err)
		}
	})
}

// decimal stores ints as decimal text, to show that DoWithCodec's codec is
// used both ways: to store the result and to replay it.
type decimal struct{}

func (decimal) Encode(v int) ([]byte, error) { return []byte(strconv.Itoa(v)), nil }
func (decimal) Decode(b []byte) (int, error) { return strconv.Atoi(string(b)) }

func TestDoWithCodecStoresAndReplaysWithItsCodec(t *testing.T) {
	f, s := newMem(t)
	runs := 0
	action := func(context.Context) (int, error) { runs++; return 1999, nil }
	first, err := coordinator.DoWithCodec(t.Context(), f.c, call("c"), decimal{}, action)
	if err != nil || first.Replayed || first.Value != 1999 {
		t.Fatalf("first = %+v, %v", first, err)
	}
	if rec := s.Snapshot(idemstore.Key{Operation: "payment.charge", Key: "c"}); string(rec.Result) != "1999" {
		t.Fatalf("stored %q, want the codec's 1999", rec.Result)
	}
	again, err := coordinator.DoWithCodec(t.Context(), f.c, call("c"), decimal{}, action)
	if err != nil || !again.Replayed || again.Value != 1999 || runs != 1 {
		t.Fatalf("retry = %+v, %v after %d runs; want the replayed 1999 after 1", again, err, runs)
	}
}

func TestRawCodecKeepsBytesAsTheyAre(t *testing.T) {
	var c coordinator.RawCodec
	in := []byte{0, 0xff, '"'}
	enc, err := c.Encode(in)
	if err != nil || string(enc) != string(in) {
		t.Fatalf("Encode = %q, %v", enc, err)
	}
	dec, err := c.Decode(enc)
	if err != nil || string(dec) != string(in) {
		t.Fatalf("Decode = %q, %v", dec, err)
	}
}
