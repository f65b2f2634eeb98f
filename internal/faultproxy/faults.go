package faultproxy

import (
	"fmt"
	"net"
	"slices"
	"time"
)

// answerWait bounds how long Release waits for the server to answer one
// connection's bytes before it delivers the next connection's.
const answerWait = time.Second

// SetLatency delays every chunk, in both directions, by d from when the
// proxy reads it, on new and existing connections; 0 (the default) turns
// the delay off. The proxy reads a connection's next chunk in a direction
// only once the last one is delivered, so chunks sent back to back can be
// delayed by up to d each: a link with d of latency and one chunk in flight.
// A chunk already waiting keeps the delay it started with.
func (p *Proxy) SetLatency(d time.Duration) {
	p.latency.Store(int64(max(d, 0)))
}

// Refuse switches refusal on or off. While it is on, nothing listens on
// Addr, so that a new connection is refused by the kernel: the client's dial
// fails at once with "connection refused", exactly as with a server that is
// down (go-redis then retries the dial DialerRetries times, and after
// PoolSize failed dials its pool returns the last dial error without dialing
// until a background probe, once a second, gets through). Connections
// waiting to be accepted are reset; open connections are not touched.
// Refuse(false) listens on Addr again and returns the error of that, should
// the port have been taken meanwhile; Refuse(true) returns nil.
func (p *Proxy) Refuse(on bool) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case p.closed:
		return nil
	case on && p.ln != nil:
		_ = p.ln.Close()
		p.ln = nil
	case !on && p.ln == nil:
		ln, err := net.Listen("tcp", p.addr)
		if err != nil {
			return fmt.Errorf("faultproxy: listen again on %s: %w", p.addr, err)
		}
		p.ln = ln
		p.lnReady.Broadcast()
	}
	return nil
}

// Reset aborts every open connection with a TCP RST, on both sides, as a
// crashed server, a failover or CLIENT KILL would: a call waiting for its
// reply fails ("connection reset by peer", or EOF). go-redis checks an idle
// pooled connection when it takes it from the pool, finds it dead and dials
// a new one, so only calls in flight fail. Bytes held for those connections
// are dropped. New connections are not affected.
func (p *Proxy) Reset() {
	p.mu.Lock()
	links := p.linkList()
	p.stats.Reset += int64(len(links))
	p.mu.Unlock()
	for _, l := range links {
		abort(l.client)
		abort(l.server)
		l.close()
	}
}

// Cut switches a partition on or off. While it is on, the proxy drops every
// chunk in both directions, on new and existing connections, without
// closing anything. Connections stay open and hang; a client sees only its
// own timeouts. New connections are accepted and dialed upstream, then hang
// too (a client's connect succeeds but its handshake times out). Cut(false)
// forwards again, but what was dropped is gone: a connection that lost bytes
// in the middle of a request or reply is out of step, and clients should
// discard it (go-redis does, after a timeout), so recovery shows on new
// connections. Bytes held by Hold are not dropped: Release delivers them,
// cut or not.
func (p *Proxy) Cut(on bool) {
	p.mu.Lock()
	p.cut = on
	p.mu.Unlock()
}

// Order is the order in which Release delivers held bytes. The zero value
// is InOrder.
type Order int

// The orders of Release.
const (
	// InOrder delivers held chunks in the order they arrived, across
	// connections: late, but as sent.
	InOrder Order = iota
	// NewestFirst delivers the connections' held bytes one connection at a
	// time, starting with the connection whose last held chunk arrived
	// last. Within a connection the bytes keep their order: TCP cannot
	// reorder a stream.
	NewestFirst
)

// String returns "in-order" or "newest-first".
func (o Order) String() string {
	switch o {
	case InOrder:
		return "in-order"
	case NewestFirst:
		return "newest-first"
	}
	return fmt.Sprintf("Order(%d)", int(o))
}

// heldChunk is one client→server chunk held until Release.
type heldChunk struct {
	link *link
	data []byte
}

// Hold holds every chunk that clients send to the server, on new and
// existing connections, until Release; server→client bytes keep flowing.
// This is the network delivering requests late: a command leaves the client
// but does not arrive, the client times out (go-redis then closes the
// connection), and the command still arrives later, possibly after commands
// sent after it on other connections. A client that closes its connection
// does not take back what it sent: the connection stays open to the server
// (Stats.Draining) until Release has delivered its bytes, then the server
// sees the end of the stream. A connection opened while holding does not
// complete a handshake that needs an answer (go-redis sends HELLO), so open
// the connections to hold before calling Hold.
func (p *Proxy) Hold() {
	p.releaseMu.Lock()
	defer p.releaseMu.Unlock()
	p.mu.Lock()
	p.holding = true
	p.mu.Unlock()
}

// Release delivers every held chunk in the given order and returns to
// pass-through. It delivers them at once (SetLatency does not apply), run by
// run, a run being the chunks of one connection that are next to each other
// in that order, each run in one write; after each run it waits, up to a
// second, until the server answers on that connection, so that the server
// has applied a run before it reads the next: the order is the one the
// server executes, not only the one the bytes arrive in, and when Release
// returns the server has answered everything it delivered. Chunks that
// arrive while Release runs are held and delivered after the others. Bytes
// of a connection reset or closed by the proxy meanwhile are dropped.
// Release without Hold does nothing.
func (p *Proxy) Release(order Order) {
	p.releaseMu.Lock()
	defer p.releaseMu.Unlock()
	for {
		p.mu.Lock()
		held := p.held
		p.held = nil
		p.stats.Held = Traffic{}
		if len(held) == 0 || p.closed {
			p.holding = false
			p.mu.Unlock()
			return
		}
		p.mu.Unlock()
		for _, run := range arrange(held, order) {
			p.deliver(run)
		}
	}
}

// arrange splits held chunks into runs, each of one connection, in the
// order of delivery.
func arrange(held []heldChunk, order Order) [][]heldChunk {
	var runs [][]heldChunk
	if order == NewestFirst {
		byLink := make(map[*link]int) // index in runs
		for _, h := range held {
			i, ok := byLink[h.link]
			if !ok {
				i = len(runs)
				byLink[h.link] = i
				runs = append(runs, nil)
			}
			runs[i] = append(runs[i], h)
		}
		// Sort by the arrival of each connection's last chunk, newest first.
		last := make(map[*link]int)
		for i, h := range held {
			last[h.link] = i
		}
		slices.SortFunc(runs, func(a, b []heldChunk) int { return last[b[0].link] - last[a[0].link] })
		return runs
	}
	for _, h := range held {
		if n := len(runs); n > 0 && runs[n-1][0].link == h.link {
			runs[n-1] = append(runs[n-1], h)
			continue
		}
		runs = append(runs, []heldChunk{h})
	}
	return runs
}

// deliver writes one connection's run of held chunks to the server, in one
// write so that the server reads them together, and waits for the server's
// answer (see Release).
func (p *Proxy) deliver(run []heldChunk) {
	l := run[0].link
	select {
	case <-l.answered: // an answer to something earlier
	default:
	}
	var data []byte
	for _, h := range run {
		data = append(data, h.data...)
	}
	l.serverMu.Lock()
	p.write(l.server, true, data, len(run))
	l.serverMu.Unlock()
	l.delivered(len(run))
	t := time.NewTimer(answerWait)
	defer t.Stop()
	select {
	case <-l.answered:
	case <-l.done:
	case <-p.done:
	case <-t.C:
	}
}

// Stats counts what the proxy did, to check that a fault was hit.
type Stats struct {
	// Accepted counts the connections accepted.
	Accepted int64
	// DialFailed counts the connections aborted because upstream could not
	// be reached.
	DialFailed int64
	// Reset counts the connections aborted by Reset.
	Reset int64
	// Open is the number of connections open now, Draining ones included.
	Open int64
	// Draining is the number of connections whose client has left with
	// bytes held: they stay open to the server until Release delivers those
	// bytes, as a network delivers what a client sent before it closed.
	Draining int64
	// ToServer and ToClient count the bytes forwarded each way, held bytes
	// once Release delivers them.
	ToServer, ToClient Traffic
	// Dropped counts the bytes Cut dropped, both ways.
	Dropped Traffic
	// Held is what is held now, waiting for Release.
	Held Traffic
	// Stalled counts the connections that StallOne stalled, from their
	// first chunk held on.
	Stalled int64
}

// Traffic counts chunks (reads from one side of a connection) and their bytes.
type Traffic struct {
	Chunks, Bytes int64
}

func (t *Traffic) add(chunks, n int) {
	t.Chunks += int64(chunks)
	t.Bytes += int64(n)
}

func (t *Traffic) sub(n int) {
	t.Chunks--
	t.Bytes -= int64(n)
}

// Stats returns the counters so far.
func (p *Proxy) Stats() Stats {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.stats
}

// StallOne stalls one connection: the next one to send a chunk to the
// server after the call (another connection's traffic keeps flowing). Its
// client→server chunks wait, in order, until Unstall; server→client bytes
// keep flowing. This is one connection whose requests stop arriving, as a
// stuck TCP flow or a lost route would make it, while every other
// connection to the same server answers.
func (p *Proxy) StallOne() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.unstall != nil {
		close(p.unstall)
	}
	p.stallNext, p.stalled, p.unstall = true, nil, make(chan struct{})
}

// Unstall ends StallOne: the stalled connection's chunks go on, late, or,
// with reset, the connection is reset (a TCP RST to both sides) and its
// chunks are dropped. It reports whether a connection was stalled.
func (p *Proxy) Unstall(reset bool) bool {
	p.mu.Lock()
	l, ch := p.stalled, p.unstall
	p.stallNext, p.stalled, p.unstall = false, nil, nil
	p.mu.Unlock()
	if reset && l != nil {
		abort(l.client)
		abort(l.server)
		l.close()
	}
	if ch != nil {
		close(ch)
	}
	return l != nil
}

// stallOf returns the channel that l's client→server chunks wait on, or
// nil when l is not the stalled connection.
func (p *Proxy) stallOf(l *link) <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stallNext && p.stalled == nil {
		p.stalled, p.stallNext = l, false
		p.stats.Stalled++
	}
	if p.stalled == l {
		return p.unstall
	}
	return nil
}
