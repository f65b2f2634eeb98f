package redisrepo_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idempotency/coordinator/idemstore"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idempotency/coordinator"
	"github.com/idemkit/idempotency/internal/redistest"
	"github.com/idemkit/idempotency/redisrepo"
)

// fencedWrite is the downstream write of docs/architecture.md ("Fences"):
// a Redis hash that keeps the fence of the last write it accepted and
// refuses a write whose fence is not greater.
var fencedWrite = redis.NewScript(`
local last = tonumber(redis.call('HGET', KEYS[1], 'fence') or '0')
if tonumber(ARGV[1]) <= last then
  return 0
end
redis.call('HSET', KEYS[1], 'fence', ARGV[1], 'value', ARGV[2])
return 1
`)

// A holder cut off from Redis (a partition) loses its key to another
// instance; its effect, already on its way, lands after the new holder's.
// The downstream store, which checks fences, accepts the new holder's write
// and refuses the stale one.
func TestStaleHoldersLateWriteIsRefused(t *testing.T) {
	const lease = 2 * time.Second
	const op = "payment.charge"
	cut, p, direct := proxied(t)
	a, _ := coord(t, redisrepo.New(cut), coordinator.WithLease(lease),
		coordinator.WithRenewInterval(lease/5), coordinator.WithStorageTimeout(lease/10),
		coordinator.WithFencedOperations(op))
	b, _ := coord(t, redisrepo.New(direct), coordinator.WithInFlight(coordinator.InFlightRaise),
		coordinator.WithFencedOperations(op))
	key := idemstore.Key{Operation: op, Key: newKey("stale").Key}
	account := "account:" + key.Key
	t.Cleanup(func() { direct.Del(context.Background(), account) })
	write := func(fence uint64, value string) bool {
		t.Helper()
		n, err := fencedWrite.Run(context.Background(), direct, []string{account}, fence, value).Int()
		if err != nil {
			t.Fatalf("downstream write: %v", err)
		}
		return n == 1
	}

	aFence := make(chan uint64, 1)
	bWrote := make(chan struct{})
	aLate := make(chan bool, 1)
	go func() {
		_, _ = coordinator.Do(context.Background(), a, callOf(key), func(ctx context.Context) (charge, error) {
			r, _ := coordinator.ReservationFromContext(ctx)
			aFence <- r.Fence
			<-ctx.Done() // the watchdog gives the key up
			// The write was already on its way: it lands after b's.
			<-bWrote
			aLate <- write(r.Fence, "a")
			return charge{}, context.Cause(ctx)
		})
	}()
	fa := <-aFence
	p.Cut(true) // a is cut off from Redis

	var fb uint64
	deadline := time.Now().Add(3 * lease)
	for fb == 0 && time.Now().Before(deadline) {
		_, err := coordinator.Do(t.Context(), b, callOf(key), func(ctx context.Context) (charge, error) {
			r, _ := coordinator.ReservationFromContext(ctx)
			fb = r.Fence
			if !write(r.Fence, "b") {
				t.Errorf("the new holder's write (fence %d) was refused", r.Fence)
			}
			return charge{ID: "b"}, nil
		})
		if err != nil && !errors.Is(err, coordinator.ErrInProgress) {
			t.Fatalf("b: %v", err)
		}
		<-time.After(10 * time.Millisecond)
	}
	if fb == 0 {
		t.Fatal("b never got the key")
	}
	close(bWrote)
	if <-aLate {
		t.Errorf("the stale holder's late write (fence %d) was accepted after the new holder's (fence %d)", fa, fb)
	}
	if fb <= fa {
		t.Errorf("fences: a %d, then b %d; want b's greater", fa, fb)
	}
	if v := direct.HGet(t.Context(), account, "value").Val(); v != "b" {
		t.Errorf("downstream value %q, want the new holder's, b", v)
	}
	p.Cut(false)
	_ = a.Close()
}

// Fences keep growing when the record and the fence key are both gone (the
// fence key outlived its ten leases): they come from the server's clock. And
// Forget leaves the fence key alone.
func TestFencesOutliveTheirKeys(t *testing.T) {
	client := redistest.Server(t)
	prefix := redistest.Prefix(t)
	s := redisrepo.New(client, redisrepo.WithKeyPrefix(prefix))
	key := newKey("outlive")
	reserve := func(last uint64) uint64 {
		t.Helper()
		_, fence, ok, err := s.ReserveFenced(t.Context(), key, pendingWrite(token(), "", time.Minute))
		if err != nil || !ok || fence <= last {
			t.Fatalf("ReserveFenced: fence %d, written %t, %v; want a fence above %d", fence, ok, err, last)
		}
		return fence
	}
	f := reserve(0)
	if n, err := s.Forget(t.Context(), key); err != nil || n != 1 {
		t.Fatalf("Forget: %d, %v", n, err)
	}
	f = reserve(f)

	// Both keys gone, as expiry would leave them.
	names, err := client.Keys(t.Context(), prefix+"*").Result()
	if err != nil || len(names) != 2 {
		t.Fatalf("keys of the store: %q, %v; want the record and its fence key", names, err)
	}
	var fenceKey string
	for _, n := range names {
		if strings.Contains(n, "#fence{") {
			fenceKey = n
		}
	}
	if fenceKey == "" {
		t.Fatalf("no fence key among %q", names)
	}
	if ttl := client.PTTL(t.Context(), fenceKey).Val(); ttl <= 9*time.Minute || ttl > 10*time.Minute {
		t.Errorf("fence key's time to live %v, want ten leases (10m)", ttl)
	}
	// The fence key is no record: Count and ScanKeys see one record.
	counts, err := s.Count(t.Context())
	if err != nil || len(counts) != 1 || counts[key.Operation].Total() != 1 {
		t.Errorf("Count() = %v, %v; want one record of %s", counts, err, key.Operation)
	}
	var scanned []idemstore.Key
	if err := s.ScanKeys(t.Context(), key.Operation, func(keys []idemstore.Key) error {
		scanned = append(scanned, keys...)
		return nil
	}); err != nil || len(scanned) != 1 || scanned[0] != key {
		t.Errorf("ScanKeys = %v, %v; want only %v", scanned, err, key)
	}
	client.Del(t.Context(), names...)
	reserve(f)
}

// Format 1 has no fences: ReserveFenced says so.
func TestFormat1HasNoFences(t *testing.T) {
	s := redisrepo.New(redistest.Server(t), redisrepo.WithKeyPrefix(redistest.Prefix(t)), redisrepo.WithRecordFormat(redisrepo.Format1))
	_, _, _, err := s.ReserveFenced(t.Context(), newKey("format1"), pendingWrite(token(), "", time.Minute))
	var se *coordinator.StorageError
	if !errors.As(err, &se) || !strings.Contains(err.Error(), "fences need record format 2") {
		t.Fatalf("ReserveFenced with format 1 = %v, want a *StorageError saying fences need format 2", err)
	}
}
