package faultproxy_test

import (
	"context"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idempotency/internal/faultproxy"
)

// recorder is an upstream that echoes every read back to its connection and
// logs it, across connections, in the order it read them.
type recorder struct {
	ln    net.Listener
	wg    sync.WaitGroup
	mu    sync.Mutex
	conns []net.Conn
	reads []string
}

// startRecorder starts a recorder, stopped when t ends.
func startRecorder(t *testing.T) *recorder {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &recorder{ln: ln}
	r.wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			r.mu.Lock()
			r.conns = append(r.conns, c)
			r.mu.Unlock()
			r.wg.Go(func() { r.echo(c) })
		}
	})
	t.Cleanup(func() {
		_ = ln.Close()
		r.mu.Lock()
		for _, c := range r.conns {
			_ = c.Close()
		}
		r.mu.Unlock()
		r.wg.Wait()
	})
	return r
}

func (r *recorder) echo(c net.Conn) {
	defer c.Close()
	buf := make([]byte, 4096)
	for {
		n, err := c.Read(buf)
		if n > 0 {
			r.mu.Lock()
			r.reads = append(r.reads, string(buf[:n]))
			r.mu.Unlock()
			if _, err := c.Write(buf[:n]); err != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

func (r *recorder) log() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return strings.Join(r.reads, " ")
}

// dial connects to p, closing the connection when t ends.
func dial(t *testing.T, p *faultproxy.Proxy) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// expect reads len(want) bytes from c and compares them with want.
func expect(t *testing.T, c net.Conn, want string) {
	t.Helper()
	got := make([]byte, len(want))
	if _, err := io.ReadFull(c, got); err != nil || string(got) != want {
		t.Errorf("read %q, %v, want %q", got, err, want)
	}
}

// TestReleaseChunks holds a1 (from A), b1 (from B), then a2 (from A), and
// checks what the server reads, in which order.
func TestReleaseChunks(t *testing.T) {
	for _, tt := range []struct {
		order faultproxy.Order
		want  string // the server's reads
	}{
		{faultproxy.InOrder, "a1 b1 a2"},
		{faultproxy.NewestFirst, "a1a2 b1"}, // A's last chunk is the newest
	} {
		t.Run(tt.order.String(), func(t *testing.T) {
			r := startRecorder(t)
			p := start(t, r.ln.Addr().String())
			a, b := dial(t, p), dial(t, p)

			p.Hold()
			for i, send := range []struct {
				c    net.Conn
				data string
			}{{a, "a1"}, {b, "b1"}, {a, "a2"}} {
				if _, err := io.WriteString(send.c, send.data); err != nil {
					t.Fatal(err)
				}
				waitFor(t, send.data+" to be held", func() bool { return p.Stats().Held.Chunks == int64(i+1) })
			}
			if got := r.log(); got != "" {
				t.Fatalf("the server read %q while holding", got)
			}

			p.Release(tt.order)
			expect(t, a, "a1a2")
			expect(t, b, "b1")
			if got := r.log(); got != tt.want {
				t.Errorf("the server read %q, want %q", got, tt.want)
			}
			if s := p.Stats(); s.Held != (faultproxy.Traffic{}) || s.ToServer.Chunks != 3 || s.ToServer.Bytes != 6 {
				t.Errorf("Stats = %+v, want nothing held, 3 chunks of 6 bytes forwarded", s)
			}

			// Pass-through again.
			if _, err := io.WriteString(b, "b2"); err != nil {
				t.Fatal(err)
			}
			expect(t, b, "b2")
		})
	}
}

// TestReleaseAfterClientLeft holds bytes of a client that then closes its
// connection: Release still delivers them, as a network would, and the
// server then sees the connection end.
func TestReleaseAfterClientLeft(t *testing.T) {
	r := startRecorder(t)
	p := start(t, r.ln.Addr().String())
	c := dial(t, p)
	p.Hold()
	if _, err := io.WriteString(c, "late"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the chunk to be held", func() bool { return p.Stats().Held.Chunks == 1 })
	_ = c.Close()
	waitFor(t, "the connection to drain", func() bool { return p.Stats().Draining == 1 })

	p.Release(faultproxy.InOrder)
	if got := r.log(); got != "late" {
		t.Errorf("the server read %q, want late", got)
	}
	waitFor(t, "the connection to close", func() bool { return p.Stats().Open == 0 })
	if s := p.Stats(); s.Draining != 0 || s.ToServer.Bytes != 4 {
		t.Errorf("Stats = %+v, want nothing draining, 4 bytes forwarded", s)
	}
}

func TestDialFailed(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close() // nothing listens there now
	p := start(t, addr)
	// The proxy aborts the client's connection: the client's connect or its
	// first read fails, depending on which comes first.
	if c, err := net.Dial("tcp", p.Addr()); err == nil {
		defer c.Close()
		if n, err := c.Read(make([]byte, 1)); err == nil {
			t.Fatalf("read through a proxy to nowhere = %d bytes", n)
		}
	}
	if s := p.Stats(); s.DialFailed != 1 || s.Open != 0 {
		t.Errorf("Stats = %+v, want 1 failed dial, nothing open", s)
	}
}

// TestCloseBusy closes a proxy with bytes held and a chunk waiting out its
// latency: Close returns, the clients see their connections end, and goleak
// (in TestMain) finds no goroutine left.
func TestCloseBusy(t *testing.T) {
	r := startRecorder(t)
	p, err := faultproxy.Start(r.ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	a, b := dial(t, p), dial(t, p)
	p.Hold()
	if _, err := io.WriteString(a, "held"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the chunk to be held", func() bool { return p.Stats().Held.Chunks == 1 })
	p.SetLatency(time.Hour)
	if _, err := io.WriteString(b, "slow"); err != nil {
		t.Fatal(err)
	}

	if err := p.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	for _, c := range []net.Conn{a, b} {
		if n, err := c.Read(make([]byte, 1)); err == nil {
			t.Errorf("read after Close = %d bytes", n)
		}
	}
	if err := p.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	p.Release(faultproxy.NewestFirst) // does nothing, at once
	if got := r.log(); got != "" {
		t.Errorf("the server read %q", got)
	}
}

// TestConcurrentFaults switches every fault back and forth while clients
// call through the proxy, for the race detector, then checks that the
// clients recover once the faults are off.
func TestConcurrentFaults(t *testing.T) {
	p := startRedis(t)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var clients []*redis.Client
	for range 4 {
		c := client(t, p, func(o *redis.Options) {
			o.ContextTimeoutEnabled = true
			o.DialerRetries = 1
		})
		clients = append(clients, c)
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
				_ = c.Ping(ctx).Err() // any error will do, under faults
				cancel()
			}
		})
	}
	for i := range 20 {
		before := p.Stats().ToClient.Chunks
		p.SetLatency(time.Duration(i%3) * time.Millisecond)
		p.Hold()
		p.Cut(i%2 == 0)
		p.Cut(false)
		p.Release(faultproxy.Order(i % 2))
		if err := p.Refuse(i%4 == 0); err != nil {
			t.Fatal(err)
		}
		if i%5 == 0 {
			p.Reset()
		}
		if err := p.Refuse(false); err != nil {
			t.Fatal(err)
		}
		// Let some calls through before the next round.
		waitFor(t, "calls to get through", func() bool { return p.Stats().ToClient.Chunks > before })
	}
	close(stop)
	wg.Wait()
	p.SetLatency(0)
	// Each client recovers (after its pool's dial probe, if it was refused),
	// and its background dials end before goleak looks.
	for _, c := range clients {
		waitFor(t, "a client to recover", func() bool { return c.Ping(t.Context()).Err() == nil })
	}
}
