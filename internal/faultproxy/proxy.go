package faultproxy

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// Proxy is a TCP proxy between clients and one upstream server that injects
// faults on demand. Start one with Start; its methods are safe for
// concurrent use.
type Proxy struct {
	upstream string
	addr     string
	stop     context.CancelFunc // ends the proxy's context: dials, latency waits
	done     <-chan struct{}    // closed by stop
	wg       sync.WaitGroup     // the accept loop and every connection's goroutines

	latency   atomic.Int64 // time.Duration
	releaseMu sync.Mutex   // serialises Hold and Release

	mu      sync.Mutex
	lnReady sync.Cond    // signalled when ln is set, or the proxy closed
	ln      net.Listener // nil while refusing
	closed  bool
	cut     bool
	holding bool
	held    []heldChunk // client→server chunks held, in arrival order
	// stallNext makes the next link that sends a chunk the stalled one; its
	// client→server chunks wait until unstall is closed. See StallOne.
	stallNext bool
	stalled   *link
	unstall   chan struct{}
	links     map[*link]struct{}
	stats     Stats
}

// Start starts a proxy that listens on a free port of 127.0.0.1 and forwards
// every connection it accepts to upstream (host:port), passing bytes through
// unchanged until a fault is switched on. It returns the error of the
// listener. Close the proxy when done.
func Start(upstream string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("faultproxy: %w", err)
	}
	ctx, stop := context.WithCancel(context.Background())
	p := &Proxy{
		upstream: upstream,
		addr:     ln.Addr().String(),
		ln:       ln,
		stop:     stop,
		done:     ctx.Done(),
		links:    make(map[*link]struct{}),
	}
	p.lnReady.L = &p.mu
	p.wg.Add(1)
	go p.accept(ctx)
	return p, nil
}

// Addr returns the address that clients connect to, 127.0.0.1:port. It
// stays the same for the life of the proxy, refusals included.
func (p *Proxy) Addr() string { return p.addr }

// Close stops the listener, closes every connection (dropping any held
// bytes) and returns once the proxy's goroutines have ended. It returns the
// listener's error; closing a closed proxy does nothing and returns nil.
func (p *Proxy) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	var err error
	if p.ln != nil {
		err = p.ln.Close()
		p.ln = nil
	}
	p.lnReady.Broadcast()
	links := p.linkList()
	p.mu.Unlock()

	p.stop()
	for _, l := range links {
		l.close()
	}
	p.wg.Wait()
	return err
}

// listener returns the listener to accept on, waiting while the proxy
// refuses, or nil once the proxy is closed.
func (p *Proxy) listener() net.Listener {
	p.mu.Lock()
	defer p.mu.Unlock()
	for p.ln == nil && !p.closed {
		p.lnReady.Wait()
	}
	return p.ln
}

// accept accepts connections until the proxy is closed.
func (p *Proxy) accept(ctx context.Context) {
	defer p.wg.Done()
	for {
		ln := p.listener()
		if ln == nil {
			return
		}
		c, err := ln.Accept()
		if errors.Is(err, net.ErrClosed) {
			continue // refusing or closed: listener says which
		}
		if err != nil {
			// Out of file descriptors, say: try again shortly.
			select {
			case <-p.done:
				return
			case <-time.After(5 * time.Millisecond):
			}
			continue
		}
		p.mu.Lock()
		p.stats.Accepted++
		p.mu.Unlock()
		p.wg.Add(1)
		go p.serve(ctx, c)
	}
}

// serve dials upstream for the client connection c and forwards between
// them until either side closes or the proxy does.
func (p *Proxy) serve(ctx context.Context, c net.Conn) {
	defer p.wg.Done()
	var d net.Dialer
	s, err := d.DialContext(ctx, "tcp", p.upstream)
	if err != nil {
		p.mu.Lock()
		p.stats.DialFailed++
		p.mu.Unlock()
		abort(c) // the client sees the upstream refuse
		return
	}
	l := &link{p: p, client: c, server: s, answered: make(chan struct{}, 1), done: make(chan struct{})}
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		l.close()
		return
	}
	p.links[l] = struct{}{}
	p.stats.Open++
	p.mu.Unlock()

	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		p.pumpDown(ctx, l)
	}()
	p.pumpUp(ctx, l)
}

// linkList returns the open links. p.mu is held.
func (p *Proxy) linkList() []*link {
	links := make([]*link, 0, len(p.links))
	for l := range p.links {
		links = append(links, l)
	}
	return links
}

// link is one proxied connection: a client's connection to the proxy and
// the proxy's connection to upstream.
type link struct {
	p              *Proxy
	client, server net.Conn
	serverMu       sync.Mutex    // serialises writes to server: the pump's and Release's
	answered       chan struct{} // gets a value when the server sends bytes
	done           chan struct{} // closed by close
	closeOnce      sync.Once

	// Under p.mu:
	pending  int  // chunks held and not yet written by Release
	draining bool // the client left with chunks pending: deliver them, then close
}

// close closes both connections, once, and forgets the link and its held
// bytes.
func (l *link) close() {
	l.closeOnce.Do(func() {
		_ = l.client.Close()
		_ = l.server.Close()
		close(l.done)
		p := l.p
		p.mu.Lock()
		defer p.mu.Unlock()
		if _, ok := p.links[l]; !ok {
			return
		}
		delete(p.links, l)
		p.stats.Open--
		if l.draining {
			p.stats.Draining--
		}
		kept := p.held[:0]
		for _, h := range p.held {
			if h.link == l {
				p.stats.Held.sub(len(h.data))
				continue
			}
			kept = append(kept, h)
		}
		clear(p.held[len(kept):])
		p.held = kept
	})
}

// clientGone handles the end of the client's side of l. Bytes the client
// sent before it left are still on their way, as they would be in a
// network, so a link with held bytes stays open to the server until Release
// has delivered them; any other link is closed. It reports whether l stays
// open.
func (l *link) clientGone() bool {
	p := l.p
	p.mu.Lock()
	if !l.draining && l.pending > 0 {
		l.draining = true
		p.stats.Draining++
	}
	draining := l.draining
	p.mu.Unlock()
	if !draining {
		l.close()
		return false
	}
	_ = l.client.Close()
	return true
}

// delivered records that Release wrote n held chunks of l, and half-closes
// the server side of a link whose client has left once nothing is pending:
// the server reads the bytes, then the end of the stream.
func (l *link) delivered(n int) {
	p := l.p
	p.mu.Lock()
	l.pending -= n
	finish := l.draining && l.pending == 0
	p.mu.Unlock()
	if finish {
		if tc, ok := l.server.(*net.TCPConn); ok {
			_ = tc.CloseWrite()
		} else {
			l.close()
		}
	}
}

// abort closes c with a TCP RST instead of a FIN, as a crashed or
// firewalled peer would.
func abort(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	_ = c.Close()
}

// pumpUp copies l from the client to the server, applying the faults to
// every chunk it reads.
func (p *Proxy) pumpUp(ctx context.Context, l *link) {
	buf := make([]byte, 32<<10)
	for {
		n, err := l.client.Read(buf)
		if n > 0 && !p.forward(ctx, l, true, buf[:n]) {
			l.close() // the server left, or the proxy is closing
			return
		}
		if err != nil {
			l.clientGone()
			return
		}
	}
}

// pumpDown copies l from the server to the client, applying the faults to
// every chunk it reads, and closes l when the server leaves. Once the client
// has left it goes on reading (and dropping) the server's answers to the
// bytes Release delivers late.
func (p *Proxy) pumpDown(ctx context.Context, l *link) {
	defer l.close()
	buf := make([]byte, 32<<10)
	for {
		n, err := l.server.Read(buf)
		if n > 0 {
			select {
			case l.answered <- struct{}{}:
			default:
			}
			if !p.forward(ctx, l, false, buf[:n]) && !l.clientGone() {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// forward delivers one chunk, after the latency, unless it is cut or held.
// It reports whether the link is still usable.
func (p *Proxy) forward(ctx context.Context, l *link, up bool, chunk []byte) bool {
	if d := time.Duration(p.latency.Load()); d > 0 {
		t := time.NewTimer(d)
		select {
		case <-ctx.Done():
			t.Stop()
			return false
		case <-t.C:
		}
	}
	dst := l.client
	if up {
		if wait := p.stallOf(l); wait != nil {
			select {
			case <-wait:
			case <-l.done:
				return false
			case <-ctx.Done():
				return false
			}
		}
		dst = l.server
		// Held bytes go out before anything read after them.
		l.serverMu.Lock()
		defer l.serverMu.Unlock()
	}
	p.mu.Lock()
	switch {
	case p.cut:
		p.stats.Dropped.add(1, len(chunk))
		p.mu.Unlock()
		return true
	case up && p.holding:
		p.held = append(p.held, heldChunk{link: l, data: append([]byte(nil), chunk...)})
		l.pending++
		p.stats.Held.add(1, len(chunk))
		p.mu.Unlock()
		return true
	}
	p.mu.Unlock()
	return p.write(dst, up, chunk, 1)
}

// write writes data, made of chunks chunks, to dst and counts it. It
// reports whether the write succeeded.
func (p *Proxy) write(dst net.Conn, up bool, data []byte, chunks int) bool {
	if _, err := dst.Write(data); err != nil {
		return false
	}
	p.mu.Lock()
	if up {
		p.stats.ToServer.add(chunks, len(data))
	} else {
		p.stats.ToClient.add(chunks, len(data))
	}
	p.mu.Unlock()
	return true
}
