package redistest_test

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idempotency/internal/redistest"
)

// TestSentinel: a failover client finds the master through the sentinel,
// and after Failover writes go to the promoted replica, which kept what was
// written before.
func TestSentinel(t *testing.T) {
	s := redistest.StartSentinel(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c := redis.NewFailoverClient(&redis.FailoverOptions{MasterName: redistest.SentinelMaster, SentinelAddrs: s.Addrs()})
	defer c.Close()
	if err := c.Set(ctx, "before", "1", 0).Err(); err != nil {
		t.Fatal(err)
	}
	first, err := s.Master(ctx)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	res, err := s.Failover(ctx)
	if err != nil {
		t.Fatal(err)
	}
	second := res.Master
	t.Logf("failover from %s to %s announced after %v, done after %v", first, second, res.Announced.Sub(start), time.Since(start))
	if res.Announced.Before(start) || res.Announced.After(time.Now()) {
		t.Errorf("announced at %v, outside the failover (%v to now)", res.Announced, start)
	}
	if second == first {
		t.Fatalf("the master is still %s", first)
	}
	// The client follows the switch (the sentinel publishes +switch-master);
	// until it has, a write may meet the former master, now read-only.
	var setErr error
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if setErr = c.Set(ctx, "after", "2", 0).Err(); setErr == nil {
			break
		}
	}
	if setErr != nil {
		t.Fatalf("no write after the failover: %v", setErr)
	}
	direct := redis.NewClient(&redis.Options{Addr: second})
	defer direct.Close()
	for key, want := range map[string]string{"before": "1", "after": "2"} {
		if got, err := direct.Get(ctx, key).Result(); err != nil || got != want {
			t.Errorf("GET %s on the new master = %q, %v; want %q", key, got, err, want)
		}
	}
}
