package sentinelcheck

import (
	"net"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idempotency/internal/redistest"
)

// The check asks the sentinels from the one that answered last: a sentinel
// that is down costs one failed dial, not one per connection.
func TestMasterAsksTheSentinelThatAnswered(t *testing.T) {
	s := redistest.StartSentinel(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	down := ln.Addr().String()
	_ = ln.Close() // refuses connections
	h := &hook{opts: redis.FailoverOptions{MasterName: redistest.SentinelMaster, SentinelAddrs: append([]string{down}, s.Addrs()...)}}
	master, err := s.Master(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		got, ok := h.master(t.Context())
		if !ok || got != master {
			t.Fatalf("master() = %q, %v; want %q", got, ok, master)
		}
		if h.first != 1 {
			t.Fatalf("asks sentinel %d first, want 1 (the one that answered)", h.first)
		}
	}
}
