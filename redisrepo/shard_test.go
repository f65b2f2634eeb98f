package redisrepo_test

import (
	"context"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idempotency/coordinator/idemstore"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idempotency/internal/redistest"
	"github.com/idemkit/idempotency/redisrepo"
)

// masterCalls returns how many times the masters of c served cmd (commandstats).
func masterCalls(t *testing.T, c *redis.ClusterClient, cmd string) int64 {
	t.Helper()
	var total atomic.Int64
	err := c.ForEachMaster(t.Context(), func(ctx context.Context, m *redis.Client) error {
		info, err := m.Info(ctx, "commandstats").Result()
		if err != nil {
			return err
		}
		for line := range strings.SplitSeq(info, "\r\n") {
			if rest, ok := strings.CutPrefix(line, "cmdstat_"+cmd+":calls="); ok {
				n, _ := strconv.ParseInt(rest[:strings.IndexByte(rest, ',')], 10, 64)
				total.Add(n)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return total.Load()
}

// TestShardedWakeUp: on Redis Cluster a watched completion is announced
// with SPUBLISH on a channel in the key's own slot, never with PUBLISH
// (which the cluster bus broadcasts to every node), and the waiter hears
// it, for keys in many slots and with hash tags and braces of their own.
func TestShardedWakeUp(t *testing.T) {
	c := redistest.Cluster(t)
	if redistest.ClusterKind(t) == redistest.KindMiniredis {
		t.Skip("needs a real cluster")
	}
	prefix := redistest.Prefix(t)
	holder := redisrepo.New(c, redisrepo.WithKeyPrefix(prefix))
	waiter := redisrepo.New(secondClient(t, c), redisrepo.WithKeyPrefix(prefix))
	publishes, spublishes := masterCalls(t, c, "publish"), masterCalls(t, c, "spublish")
	names := []string{"plain", "{tag}x", "a{b", "a}b{", "{}y", "z{c}d{e}"}
	for i := range 20 {
		names = append(names, "k"+strconv.Itoa(i))
	}
	for _, name := range names {
		key := idemstore.Key{Operation: "shard", Key: name + "-" + token()[:8]}
		tok := token()
		mustReserve(t, holder, key, pendingWrite(tok, "", time.Minute))
		rec, ch, stop, err := waiter.Watch(t.Context(), key)
		if err != nil || rec.State != idemstore.StatePending || ch == nil {
			t.Fatalf("Watch(%s) = %+v, %v, %v; want the pending record and a channel", key, rec, ch, err)
		}
		// The subscription may come up after the completion: its
		// confirmation wakes the waiter too, so wait for a wake-up that
		// finds the record completed.
		if ok, err := holder.Complete(t.Context(), key, tok, idemstore.Completion{State: idemstore.StateCompleted, Result: []byte("r"), TTL: time.Minute}); err != nil || !ok {
			t.Fatalf("Complete(%s): %v, %v", key, ok, err)
		}
		select {
		case <-ch:
		case <-time.After(10 * time.Second):
			t.Fatalf("Watch(%s): no wake-up", key)
		}
		stop()
	}
	if n := masterCalls(t, c, "publish") - publishes; n != 0 {
		t.Errorf("%d PUBLISH calls, want 0: the announcements are sharded", n)
	}
	if n := masterCalls(t, c, "spublish") - spublishes; n != int64(len(names)) {
		t.Errorf("%d SPUBLISH calls, want %d, one per watched completion", n, len(names))
	}
}
