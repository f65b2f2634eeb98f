package faultproxy_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idempotency/internal/faultproxy"
	"github.com/idemkit/idempotency/internal/redistest"
)

// start starts a proxy to upstream, closed when t ends.
func start(t *testing.T, upstream string) *faultproxy.Proxy {
	t.Helper()
	p, err := faultproxy.Start(upstream)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := p.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return p
}

// startRedis starts a proxy to the shared test Redis.
func startRedis(t *testing.T) *faultproxy.Proxy {
	t.Helper()
	return start(t, redistest.ServerOptions(t).Addr)
}

// client returns a go-redis client of p with one connection, no retries,
// and opts applied, closed when t ends.
func client(t *testing.T, p *faultproxy.Proxy, opts func(*redis.Options)) *redis.Client {
	t.Helper()
	o := &redis.Options{Addr: p.Addr(), PoolSize: 1, MaxRetries: -1}
	if opts != nil {
		opts(o)
	}
	c := redis.NewClient(o)
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func ping(t *testing.T, c *redis.Client) {
	t.Helper()
	if err := c.Ping(t.Context()).Err(); err != nil {
		t.Fatalf("PING: %v", err)
	}
}

// waitFor polls cond until it holds, failing t after a few seconds.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); !cond(); {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.Is(err, context.DeadlineExceeded) || errors.As(err, &ne) && ne.Timeout()
}

func TestPassThrough(t *testing.T) {
	p := startRedis(t)
	c := client(t, p, nil)
	key := redistest.Prefix(t) + "k"
	if err := c.Set(t.Context(), key, "v", time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	if v, err := c.Get(t.Context(), key).Result(); v != "v" || err != nil {
		t.Errorf("GET = %q, %v, want v", v, err)
	}
	s := p.Stats()
	if s.Accepted != 1 || s.Open != 1 || s.ToServer.Bytes == 0 || s.ToClient.Bytes == 0 {
		t.Errorf("Stats = %+v, want 1 connection accepted and open, bytes both ways", s)
	}
}

func TestLatency(t *testing.T) {
	p := startRedis(t)
	c := client(t, p, nil)
	ping(t, c)
	const d = 50 * time.Millisecond
	p.SetLatency(d)
	begin := time.Now()
	ping(t, c)
	if took := time.Since(begin); took < 2*d {
		t.Errorf("PING took %v with latency %v each way, want at least %v", took, d, 2*d)
	}
	p.SetLatency(0)
	ping(t, c)
}

func TestRefuse(t *testing.T) {
	p := startRedis(t)
	old := client(t, p, nil)
	ping(t, old)

	if err := p.Refuse(true); err != nil {
		t.Fatal(err)
	}
	c := client(t, p, func(o *redis.Options) { o.DialerRetries = 1 })
	begin := time.Now()
	err := c.Ping(t.Context()).Err()
	took := time.Since(begin)
	if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("PING through a refusing proxy = %v, want connection refused", err)
	}
	if took > 100*time.Millisecond {
		t.Errorf("PING failed after %v, want under 100ms", took)
	}
	ping(t, old) // open connections stay
	if s := p.Stats(); s.Accepted != 1 {
		t.Errorf("Stats = %+v, want only the first connection accepted", s)
	}

	if err := p.Refuse(false); err != nil {
		t.Fatal(err)
	}
	ping(t, client(t, p, nil))
	// c's pool returns its last dial error until its probe, once a second,
	// gets through.
	waitFor(t, "the refused client to recover", func() bool { return c.Ping(t.Context()).Err() == nil })
}

func TestReset(t *testing.T) {
	p := startRedis(t)

	// A raw idle connection sees an RST, not a FIN.
	raw, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	if _, err := io.WriteString(raw, resp("PING")); err != nil {
		t.Fatal(err)
	}
	if line, err := readLine(raw); line != "+PONG" || err != nil {
		t.Fatalf("PING = %q, %v", line, err)
	}

	// A go-redis call in flight fails; an idle go-redis connection is
	// replaced without a word.
	c, idle := client(t, p, nil), client(t, p, nil)
	ping(t, c)
	ping(t, idle)
	key := redistest.Prefix(t) + "list"
	before := p.Stats().ToServer.Bytes
	blpop := make(chan error, 1)
	go func() { blpop <- c.BLPop(context.Background(), 0, key).Err() }()
	waitFor(t, "BLPOP to reach the server", func() bool { return p.Stats().ToServer.Bytes > before })

	p.Reset()
	if err := <-blpop; err == nil {
		t.Error("BLPOP on a reset connection succeeded")
	} else {
		t.Logf("BLPOP: %v", err)
	}
	if _, err := raw.Read(make([]byte, 1)); !errors.Is(err, syscall.ECONNRESET) {
		t.Errorf("read after Reset: %v, want connection reset", err)
	}
	if s := p.Stats(); s.Reset != 3 || s.Open != 0 {
		t.Errorf("Stats = %+v, want 3 connections reset, none open", s)
	}
	ping(t, idle)
	ping(t, c)
	if s := p.Stats(); s.Accepted != 5 {
		t.Errorf("Stats = %+v, want 5 connections accepted: 3, then 2 new ones", s)
	}
}

func readLine(c net.Conn) (string, error) {
	var b strings.Builder
	one := make([]byte, 1)
	for {
		if _, err := c.Read(one); err != nil {
			return b.String(), err
		}
		if one[0] == '\n' {
			return strings.TrimSuffix(b.String(), "\r"), nil
		}
		b.WriteByte(one[0])
	}
}

func TestCut(t *testing.T) {
	p := startRedis(t)
	c := client(t, p, func(o *redis.Options) { o.ContextTimeoutEnabled = true })
	ping(t, c)

	p.Cut(true)
	ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
	defer cancel()
	begin := time.Now()
	err := c.Ping(ctx).Err()
	if !isTimeout(err) {
		t.Fatalf("PING across a cut = %v, want a timeout", err)
	}
	t.Logf("PING across a cut: %v after %v", err, time.Since(begin))
	if s := p.Stats(); s.Dropped.Bytes == 0 {
		t.Errorf("Stats = %+v, want bytes dropped", s)
	}

	// A raw connection hangs: no reply, and no close either.
	raw, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	if _, err := io.WriteString(raw, resp("PING")); err != nil {
		t.Fatal(err)
	}
	_ = raw.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
	if n, err := raw.Read(make([]byte, 1)); !isTimeout(err) {
		t.Errorf("read across a cut = %d, %v, want a timeout", n, err)
	}

	p.Cut(false)
	ping(t, client(t, p, nil))
	ping(t, c) // go-redis replaced the connection that timed out
}

// TestHoldRelease sends SETs of one key from two clients, A then B, while
// held: newest first, the server applies B's before A's.
func TestHoldRelease(t *testing.T) {
	for _, tt := range []struct {
		order faultproxy.Order
		want  string
	}{
		{faultproxy.InOrder, "b"},
		{faultproxy.NewestFirst, "a"},
	} {
		t.Run(tt.order.String(), func(t *testing.T) {
			p := startRedis(t)
			a, b := client(t, p, nil), client(t, p, nil)
			ping(t, a)
			ping(t, b)
			key := redistest.Prefix(t) + "k"

			p.Hold()
			var wg sync.WaitGroup
			set := func(c *redis.Client, v string) {
				t.Helper()
				n := p.Stats().Held.Bytes + int64(len(resp("set", key, v)))
				wg.Go(func() {
					if err := c.Set(context.Background(), key, v, 0).Err(); err != nil {
						t.Errorf("SET %s: %v", v, err)
					}
				})
				waitFor(t, "SET "+v+" to be held", func() bool { return p.Stats().Held.Bytes == n })
			}
			set(a, "a")
			set(b, "b")
			if s := p.Stats(); s.Held.Chunks != 2 {
				t.Errorf("Stats = %+v, want 2 chunks held", s)
			}

			p.Release(tt.order)
			wg.Wait()
			if v, err := a.Get(t.Context(), key).Result(); v != tt.want || err != nil {
				t.Errorf("GET = %q, %v, want %q", v, err, tt.want)
			}
			_ = a.Del(t.Context(), key)
		})
	}
}

// resp returns args as a RESP command.
func resp(args ...string) string {
	s := fmt.Sprintf("*%d\r\n", len(args))
	for _, a := range args {
		s += fmt.Sprintf("$%d\r\n%s\r\n", len(a), a)
	}
	return s
}

// TestLateWrite is the late save of issue 9: client A's SET times out while
// held, and go-redis closes A's connection; client B then sets the key.
// Delivered newest first, B's SET is applied, then A's late one.
func TestLateWrite(t *testing.T) {
	p := startRedis(t)
	a := client(t, p, func(o *redis.Options) { o.ContextTimeoutEnabled = true })
	b := client(t, p, nil)
	ping(t, a)
	ping(t, b)
	key := redistest.Prefix(t) + "k"

	p.Hold()
	ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
	defer cancel()
	if err := a.Set(ctx, key, "a", 0).Err(); !isTimeout(err) {
		t.Fatalf("held SET = %v, want a timeout", err)
	}
	waitFor(t, "A's connection to drain", func() bool { return p.Stats().Draining == 1 })
	set := make(chan error, 1)
	go func() { set <- b.Set(context.Background(), key, "b", 0).Err() }()
	waitFor(t, "B's SET to be held", func() bool { return p.Stats().Held.Chunks == 2 })

	p.Release(faultproxy.NewestFirst)
	if err := <-set; err != nil {
		t.Fatalf("SET b: %v", err)
	}
	if v, err := b.Get(t.Context(), key).Result(); v != "a" || err != nil {
		t.Errorf("GET = %q, %v, want a: the late SET applied last", v, err)
	}
	_ = b.Del(t.Context(), key)
}

func TestStallOne(t *testing.T) {
	p := startRedis(t)
	stuck, other := client(t, p, nil), client(t, p, nil)
	ping(t, stuck)
	ping(t, other)
	for round, reset := range []bool{false, true} {
		p.StallOne()
		late := make(chan error, 1)
		go func() { late <- stuck.Ping(context.Background()).Err() }()
		waitFor(t, "the connection to stall", func() bool { return p.Stats().Stalled == int64(round+1) })
		for range 5 { // the other connection answers throughout
			ping(t, other)
		}
		select {
		case err := <-late:
			t.Fatalf("PING on the stalled connection returned %v during the stall", err)
		default:
		}
		if !p.Unstall(reset) {
			t.Fatal("Unstall found no stalled connection")
		}
		err := <-late
		switch {
		case !reset && err != nil:
			t.Fatalf("the stalled PING, delivered late: %v", err)
		case reset && err == nil:
			t.Fatal("the PING of a reset connection succeeded")
		}
		ping(t, stuck) // a new connection when reset
		ping(t, other)
	}
	if p.Unstall(false) {
		t.Error("Unstall without StallOne found a stalled connection")
	}
}
