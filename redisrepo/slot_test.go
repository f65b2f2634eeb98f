package redisrepo_test

import (
	"context"
	"math/rand/v2"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idempotency/internal/redistest"
	"github.com/idemkit/idempotency/redisrepo"
)

func TestHashSlotVectors(t *testing.T) {
	for _, tc := range []struct {
		key  string
		slot int
	}{
		{"123456789", 12739}, // CRC16/XMODEM check value 0x31C3
		{"", 0},
		{"foo", 12182},
		{"{user1000}.following", redisrepo.HashSlot("user1000")},
		{"{user1000}.followers", redisrepo.HashSlot("user1000")},
		{"foo{}{bar}", redisrepo.HashSlot("foo{}{bar}")}, // empty tag: the whole key
		{"foo{{bar}}zap", redisrepo.HashSlot("{bar")},
		{"foo{bar}{zap}", redisrepo.HashSlot("bar")},
		{"idempotency:op:{tenant-7}:order-1", redisrepo.HashSlot("tenant-7")},
	} {
		if got := redisrepo.HashSlot(tc.key); got != tc.slot {
			t.Errorf("HashSlot(%q) = %d, want %d", tc.key, got, tc.slot)
		}
	}
}

// TestHashSlotMatchesCluster compares HashSlot with CLUSTER KEYSLOT on real
// Redis for keys of every visible ASCII character, braces above all.
func TestHashSlotMatchesCluster(t *testing.T) {
	ctx := context.Background()
	node := redis.NewClient(&redis.Options{Addr: redistest.ClusterAddrs(t)[0]})
	defer node.Close()

	keys := hostileKeys()
	rnd := rand.New(rand.NewPCG(1, 2))
	const alphabet = "{}{}{}:ab"
	for range 2000 {
		n := 1 + rnd.IntN(24)
		b := make([]byte, n)
		for i := range b {
			if rnd.IntN(2) == 0 {
				b[i] = alphabet[rnd.IntN(len(alphabet))]
			} else {
				b[i] = byte(0x21 + rnd.IntN(0x7e-0x21+1))
			}
		}
		keys = append(keys, "idempotency:op:"+string(b))
	}
	cmds := make([]*redis.IntCmd, len(keys))
	pipe := node.Pipeline()
	for i, k := range keys {
		cmds[i] = pipe.ClusterKeySlot(ctx, k)
	}
	if _, err := pipe.Exec(ctx); err != nil {
		t.Fatalf("CLUSTER KEYSLOT: %v", err)
	}
	for i, k := range keys {
		if got, want := redisrepo.HashSlot(k), int(cmds[i].Val()); got != want {
			t.Errorf("HashSlot(%q) = %d, CLUSTER KEYSLOT says %d", k, got, want)
		}
	}
}
