//go:build linux

package reliability_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"os"
	"runtime/metrics"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idempotency/internal/redistest"
)

// A stall probe tells a store's failure from the machine's. It pings every
// node of a cluster, on connections of its own, every stallProbeEvery, and
// keeps every ping that took stallProbeMin or longer: a window in which the
// node answered nothing at all. A ping sees a stall of this process only
// when it was in flight as the stall began, and a pinger mostly sleeps: so
// a heartbeat beside the pingers wakes every stallProbeEvery and keeps
// every wake-up that came stallProbeMin or more late, a window in which this
// process ran nothing (a starved or frozen process, a paused machine). Every
// call in flight then times out at once when it resumes. A store call that
// timed out inside such a window met an outage, which the storage-error
// mode governs; one that timed out while every node answered its pings and
// the process ran met a defect.
const (
	stallProbeEvery = 10 * time.Millisecond
	stallProbeMin   = 100 * time.Millisecond
)

// stallProcess is the address of a heartbeat's window: this process.
const stallProcess = "this process"

// stallWindow is one slow ping: from when it was sent to when it was
// answered (or failed); or one late heartbeat: from when it was due to
// when it came.
type stallWindow struct {
	addr     string
	from, to time.Time
}

func (w stallWindow) String() string {
	return fmt.Sprintf("%s %v", w.addr, w.to.Sub(w.from).Round(time.Millisecond))
}

// stallProbe pings the nodes of a store until stopped.
type stallProbe struct {
	nodes   func() []string // the addresses of the nodes, asked every 50ms
	stop    chan struct{}
	wg      sync.WaitGroup
	mu      sync.Mutex
	pinging map[string]bool // by address: nodes with a pinger
	windows []stallWindow
}

// startStallProbe starts pinging the nodes that nodes returns, and every
// node it returns later.
func startStallProbe(nodes func() []string) *stallProbe {
	p := &stallProbe{nodes: nodes, stop: make(chan struct{}), pinging: map[string]bool{}}
	p.pingNew() // now: a check of leaked goroutines after this sees every pinger of these nodes
	p.wg.Go(p.watch)
	p.wg.Go(p.heartbeat)
	return p
}

// heartbeat sleeps stallProbeEvery at a time and keeps every wake-up that
// came stallProbeMin or more after it was due.
func (p *stallProbe) heartbeat() {
	for {
		due := time.Now().Add(stallProbeEvery)
		select {
		case <-p.stop:
			return
		case <-time.After(stallProbeEvery):
		}
		if now := time.Now(); now.Sub(due) >= stallProbeMin {
			p.mu.Lock()
			p.windows = append(p.windows, stallWindow{addr: stallProcess, from: due, to: now})
			p.mu.Unlock()
		}
	}
}

// pingNew starts a pinger for every node that has none yet.
func (p *stallProbe) pingNew() {
	for _, addr := range p.nodes() {
		p.mu.Lock()
		seen := p.pinging[addr]
		p.pinging[addr] = true
		p.mu.Unlock()
		if !seen {
			p.wg.Go(func() { p.ping(addr) })
		}
	}
}

// watch starts a pinger for every node it has not seen yet, every 50ms.
func (p *stallProbe) watch() {
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		p.pingNew()
		select {
		case <-p.stop:
			return
		case <-tick.C:
		}
	}
}

// ping pings addr every stallProbeEvery and keeps the slow pings. A node
// killed later refuses the probe's connections, which says nothing of a
// stall: those pings are not kept.
func (p *stallProbe) ping(addr string) {
	c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, DialerRetries: 1, PoolSize: 1, DialTimeout: 10 * time.Second, ReadTimeout: 10 * time.Second})
	defer c.Close()
	for {
		select {
		case <-p.stop:
			return
		case <-time.After(stallProbeEvery):
		}
		from := time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		err := c.Ping(ctx).Err()
		cancel()
		if to := time.Now(); to.Sub(from) >= stallProbeMin && !refusedDial(err) {
			p.mu.Lock()
			p.windows = append(p.windows, stallWindow{addr: addr, from: from, to: to})
			p.mu.Unlock()
		}
	}
}

// ownNodes returns the addresses of cl's nodes, for startStallProbe.
func ownNodes(cl *redistest.OwnCluster) func() []string {
	return func() []string {
		var addrs []string
		for _, n := range cl.Nodes() {
			addrs = append(addrs, n.Addr())
		}
		return addrs
	}
}

// longestStall returns the longest window of windows (zero when there is
// none).
func longestStall(windows []stallWindow) stallWindow {
	var l stallWindow
	for _, w := range windows {
		if w.to.Sub(w.from) > l.to.Sub(l.from) {
			l = w
		}
	}
	return l
}

// end stops the probe and returns its windows, in order of their start.
func (p *stallProbe) end() []stallWindow {
	close(p.stop)
	p.wg.Wait()
	sort.Slice(p.windows, func(i, j int) bool { return p.windows[i].from.Before(p.windows[j].from) })
	return p.windows
}

// stalledDuring returns the first window of windows that lasted at least
// half of timeout and overlaps the span [at-timeout, at]: a call that timed
// out at at met it. A node stalled for half a storage timeout leaves the
// calls queued behind it the other half at most.
func stalledDuring(windows []stallWindow, at time.Time, timeout time.Duration) (stallWindow, bool) {
	for _, w := range windows {
		if w.to.Sub(w.from) >= timeout/2 && overlaps(w.from, w.to, at.Add(-timeout), at) {
			return w, true
		}
	}
	return stallWindow{}, false
}

// overlaps reports whether the span [from, to] overlaps [otherFrom,
// otherTo].
func overlaps(from, to, otherFrom, otherTo time.Time) bool {
	return from.Before(otherTo) && to.After(otherFrom)
}

// longestStalls describes the longest window of each node, for the log.
func longestStalls(windows []stallWindow) string {
	longest := map[string]time.Duration{}
	for _, w := range windows {
		longest[w.addr] = max(longest[w.addr], w.to.Sub(w.from))
	}
	if len(longest) == 0 {
		return "none of " + stallProbeMin.String() + " or more"
	}
	var parts []string
	for addr, d := range longest {
		parts = append(parts, addr+" "+d.Round(time.Millisecond).String())
	}
	sort.Strings(parts)
	return strings.Join(parts, ", ")
}

// longestGCPause describes the longest stop-the-world pause of this
// process's garbage collector so far (a bucket's upper bound), which a late
// heartbeat may be.
func longestGCPause() string {
	sample := []metrics.Sample{{Name: "/sched/pauses/total/gc:seconds"}}
	metrics.Read(sample)
	if sample[0].Value.Kind() != metrics.KindFloat64Histogram {
		return "no GC pause histogram"
	}
	h := sample[0].Value.Float64Histogram()
	for i := len(h.Counts) - 1; i >= 0; i-- {
		if h.Counts[i] > 0 {
			if hi := h.Buckets[i+1]; !math.IsInf(hi, 1) {
				return fmt.Sprintf("longest GC pause of this process at most %v", time.Duration(hi*float64(time.Second)).Round(time.Microsecond))
			}
			return fmt.Sprintf("longest GC pause of this process over %v", time.Duration(h.Buckets[i]*float64(time.Second)).Round(time.Microsecond))
		}
	}
	return "no GC pause yet"
}

// stealTicks returns the machine's CPU time stolen by its hypervisor so
// far, from /proc/stat, in clock ticks (USER_HZ, 100 a second), or -1
// when it cannot be read: a paused or starved virtual machine freezes
// every process at once.
func stealTicks() int64 {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return -1
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	if len(f) < 9 || f[0] != "cpu" {
		return -1
	}
	n, err := strconv.ParseInt(f[8], 10, 64)
	if err != nil {
		return -1
	}
	return n
}

// stolenSince describes the CPU time stolen since before, a stealTicks.
func stolenSince(before int64) string {
	after := stealTicks()
	if before < 0 || after < 0 {
		return "CPU steal unknown"
	}
	return fmt.Sprintf("CPU time stolen by the hypervisor meanwhile %v", time.Duration(after-before)*10*time.Millisecond)
}

// refusedDial reports whether err is a refused connection.
func refusedDial(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "dial"
}
