//go:build linux

package reliability_test

import (
	"context"
	"fmt"
	"net"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// A node trace tells where a store call that timed out spent its time: it
// times every command, pipeline and dial that a cluster client's node
// clients send, and keeps those that took nodeTraceMin or longer or failed.
// Beside the stall probe it separates a node that answered nobody (the
// probe's window) from one connection that waited (a slow command here and
// no window there) and from a call that never reached a node (no slow
// command at all: the client held it).
const nodeTraceMin = 200 * time.Millisecond

// traced is one slow or failed command, pipeline or dial of a node client.
type traced struct {
	client, addr, what string
	from, to           time.Time
	err                error
}

// nodeTrace collects the traced operations of one or more cluster clients.
type nodeTrace struct {
	mu  sync.Mutex
	ops []traced
}

// attach traces every node client that c creates from now on, naming them
// client. Call it before c sends anything.
func (tr *nodeTrace) attach(client string, c *redis.ClusterClient) {
	c.OnNewNode(func(n *redis.Client) {
		n.AddHook(traceHook{tr: tr, client: client, addr: n.Options().Addr})
	})
}

// kept reports whether an operation from from to to that ended with err
// is one the trace keeps: slow or failed.
func kept(from, to time.Time, err error) bool {
	return to.Sub(from) >= nodeTraceMin || err != nil
}

// keep adds op to the trace when it is slow or failed.
func (tr *nodeTrace) keep(op traced) {
	if !kept(op.from, op.to, op.err) {
		return
	}
	tr.mu.Lock()
	tr.ops = append(tr.ops, op)
	tr.mu.Unlock()
}

// around returns the traced operations that overlap [from, to], in order of
// their start.
func (tr *nodeTrace) around(from, to time.Time) []traced {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	var out []traced
	for _, op := range tr.ops {
		if overlaps(op.from, op.to, from, to) {
			out = append(out, op)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].from.Before(out[j].from) })
	return out
}

// describe renders op with its times relative to start.
func (op traced) describe(start time.Time) string {
	s := fmt.Sprintf("%s %s %s from %v to %v (%v)", op.client, op.addr, op.what,
		op.from.Sub(start).Round(time.Millisecond), op.to.Sub(start).Round(time.Millisecond), op.to.Sub(op.from).Round(time.Millisecond))
	if op.err != nil {
		s += ": " + op.err.Error()
	}
	return s
}

// traceHook is the redis.Hook of one node client.
type traceHook struct {
	tr           *nodeTrace
	client, addr string
}

func (h traceHook) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		from := time.Now()
		c, err := next(ctx, network, addr)
		h.tr.keep(traced{client: h.client, addr: h.addr, what: "dial", from: from, to: time.Now(), err: err})
		return c, err
	}
}

func (h traceHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		from := time.Now()
		err := next(ctx, cmd)
		h.tr.keep(traced{client: h.client, addr: h.addr, what: cmd.Name(), from: from, to: time.Now(), err: err})
		return err
	}
}

func (h traceHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		from := time.Now()
		err := next(ctx, cmds)
		to := time.Now()
		if !kept(from, to, err) {
			return err // most pipelines: describe none of them
		}
		var names []string
		for _, c := range cmds[:min(len(cmds), 4)] {
			names = append(names, c.Name())
		}
		if len(cmds) > 4 {
			names = append(names, "...")
		}
		h.tr.keep(traced{client: h.client, addr: h.addr, what: fmt.Sprintf("pipeline of %d [%s]", len(cmds), strings.Join(names, " ")), from: from, to: to, err: err})
		return err
	}
}

// phase is one step of a storm (a resharding's, a failover's), for a
// failure's log.
type phase struct {
	name     string
	from, to time.Time
}

// logAround logs, relative to start, the steps of a storm, the stall
// probe's windows and the node trace's slow or failed operations that
// overlap [from, to]: what a storage error that no window explains met.
func logAround(t interface{ Logf(string, ...any) }, start time.Time, phases []phase, windows []stallWindow, tr *nodeTrace, from, to time.Time) {
	rel := func(at time.Time) time.Duration { return at.Sub(start).Round(time.Millisecond) }
	t.Logf("around the storage errors, from %v to %v after the traffic began:", rel(from), rel(to))
	for _, p := range phases {
		t.Logf("  step %v to %v: %s", rel(p.from), rel(p.to), p.name)
	}
	for _, w := range windows {
		if overlaps(w.from, w.to, from, to) {
			t.Logf("  probe: %s answered no ping from %v to %v", w.addr, rel(w.from), rel(w.to))
		}
	}
	ops := tr.around(from, to)
	const most = 80
	for _, op := range ops[:min(len(ops), most)] {
		t.Logf("  node client: %s", op.describe(start))
	}
	if len(ops) > most {
		t.Logf("  node client: %d more", len(ops)-most)
	}
	if len(ops) == 0 {
		t.Logf("  node client: no command, pipeline or dial took %v or failed: the calls never reached a node", nodeTraceMin)
	}
}
