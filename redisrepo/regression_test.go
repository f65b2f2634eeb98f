package redisrepo_test

import (
	"context"
	"math"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idempotency/coordinator/idemstore"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idempotency/coordinator"
	"github.com/idemkit/idempotency/internal/redistest"
)

// maxWholeMillisTTL is the longest TTL the coordinator can hand a Store: a
// time.Duration truncated to whole milliseconds (coordinator.resolveTTL).
var maxWholeMillisTTL = time.Duration(math.MaxInt64).Truncate(time.Millisecond)

// TestHugeTTLDoesNotDeleteTheRecord: millis() computes
// (d + 1ms - 1) / 1ms, which overflows for d > MaxInt64-999999ns and yields
// a negative number of milliseconds; PEXPIRE with a negative value deletes
// the key. Reserve then reports "written" for a record that is not there,
// and Renew/Complete report success after deleting the owner's record.
func TestHugeTTLDoesNotDeleteTheRecord(t *testing.T) {
	eachBackend(t, func(t *testing.T, c redis.UniversalClient) {
		ctx := context.Background()
		s := newStore(t, c)

		key := newKey("overflow-reserve")
		_, ok, err := s.Reserve(ctx, key, pendingWrite(token(), "", maxWholeMillisTTL))
		if err == nil && ok {
			if rec := mustGet(t, s, key); rec.State != idemstore.StatePending {
				t.Errorf("Reserve(TTL %v) = written, but Get = %s: the write deleted itself", maxWholeMillisTTL, rec.State)
			}
		}

		key = newKey("overflow-renew")
		tok := token()
		mustReserve(t, s, key, pendingWrite(tok, "", time.Minute))
		ok, err = s.Renew(ctx, key, tok, maxWholeMillisTTL)
		if err == nil && ok {
			if rec := mustGet(t, s, key); rec.State != idemstore.StatePending {
				t.Errorf("Renew(lease %v) = true, but Get = %s: the renewal deleted the lease", maxWholeMillisTTL, rec.State)
			}
		}

		key = newKey("overflow-complete")
		tok = token()
		mustReserve(t, s, key, pendingWrite(tok, "", time.Minute))
		ok, err = s.Complete(ctx, key, tok, idemstore.Completion{State: idemstore.StateCompleted, Result: []byte("r"), TTL: maxWholeMillisTTL})
		if err == nil && ok {
			if rec := mustGet(t, s, key); rec.State != idemstore.StateCompleted {
				t.Errorf("Complete(ttl %v) = true, but Get = %s: the result was deleted", maxWholeMillisTTL, rec.State)
			}
		}
	})
}

// TestHugeTTLThroughTheEngine: the same through the coordinator, with
// TTL bounds that allow the longest Duration (a "keep forever" config): the
// action runs on every call, because each record deletes itself.
func TestHugeTTLThroughTheEngine(t *testing.T) {
	c := redistest.Server(t)
	s := newStore(t, c)
	co, err := coordinator.New(s,
		coordinator.WithMinTTL(time.Second), coordinator.WithMaxTTL(time.Duration(math.MaxInt64)),
		coordinator.WithInFlight(coordinator.InFlightRaise))
	if err != nil {
		t.Fatal(err)
	}
	defer co.Close()
	var runs atomic.Int64
	call := coordinator.Call{Operation: "review.op", Key: "forever-" + token(), TTL: time.Duration(math.MaxInt64)}
	for range 2 {
		if _, err := coordinator.Do(context.Background(), co, call, func(context.Context) (int, error) {
			return int(runs.Add(1)), nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	if n := runs.Load(); n != 1 {
		t.Errorf("two calls with one key and TTL %v ran the action %d times, want 1", call.TTL, n)
	}
}

// TestOwnerScriptsReadAsGetDoes: record.lua's owned() checks v,
// state and token but not fp, while read() requires fp. A hash
// {v=1, state=pending, token=T} is reported unreadable by Get and Reserve
// (and replaced by a heal with ReplaceToken ""), yet Renew, Complete and
// Release with T act on it as a pending record owned by T. Complete even
// returns true and leaves a record that is still unreadable.
func TestOwnerScriptsReadAsGetDoes(t *testing.T) {
	eachBackend(t, func(t *testing.T, c redis.UniversalClient) {
		ctx := context.Background()
		s := newStore(t, c)
		key := newKey("no-fp")
		name := s.Key(key)
		if err := c.HSet(ctx, name, "v", "1", "state", "pending", "token", "T").Err(); err != nil {
			t.Fatal(err)
		}
		c.PExpire(ctx, name, time.Minute)
		if rec := mustGet(t, s, key); rec.State != idemstore.StateUnreadable {
			t.Fatalf("Get = %+v, want unreadable (no fp)", rec)
		}
		if ok, err := s.Renew(ctx, key, "T", time.Minute); ok || err != nil {
			t.Errorf("Renew(T) on a record Get calls unreadable = %v, %v; want false", ok, err)
		}
		if ok, err := s.Complete(ctx, key, "T", idemstore.Completion{State: idemstore.StateCompleted, Result: []byte("r"), TTL: time.Minute}); ok || err != nil {
			t.Errorf("Complete(T) on a record Get calls unreadable = %v, %v; want false", ok, err)
			if rec := mustGet(t, s, key); rec.State != idemstore.StateCompleted {
				t.Errorf("  and after that successful Complete, Get = %s: the result can never be replayed", rec.State)
			}
		}
	})
}
