package sentinelcheck

import (
	"context"
	"net"
	"syscall"
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

// A checked TCP connection keeps its socket visible to go-redis's health
// check of idle connections (syscall.Conn); a connection without one (TLS,
// a pipe) does not claim it, or the check would fail it.
func TestCheckedConnKeepsTheSocket(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	h := &hook{}
	dial := h.DialHook(func(ctx context.Context, network, addr string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, network, addr)
	})
	conn, err := dial(t.Context(), "tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, ok := conn.(syscall.Conn); !ok {
		t.Fatalf("a checked TCP connection (%T) hides its socket", conn)
	}
	p1, p2 := net.Pipe()
	defer p2.Close()
	piped, err := h.DialHook(func(context.Context, string, string) (net.Conn, error) { return p1, nil })(t.Context(), "tcp", "x")
	if err != nil {
		t.Fatal(err)
	}
	defer piped.Close()
	if _, ok := piped.(syscall.Conn); ok {
		t.Fatalf("a checked pipe (%T) claims a socket", piped)
	}
}
