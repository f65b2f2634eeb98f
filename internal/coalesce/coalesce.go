// Package coalesce sends the Redis commands of concurrent callers together
// without delaying a caller that is alone.
//
// A Coalescer has a few lanes. A command that finds a lane idle is sent at
// once, on its caller's goroutine, exactly as the client would send it
// alone: one caller pays a mutex and nothing else. A command that finds
// every lane busy queues on one of them; when the lane's command in flight
// returns, everything queued meanwhile goes in one pipeline, sent by a
// goroutine that lives until the lane is idle again. So a lane never has
// more than one round trip in flight, and the commands of 64 callers take a
// few pipelines where they took 64 round trips.
//
// A queued command waits only as long as its caller's context allows: a
// caller whose context ends returns its error at once. Its command is
// dropped if it was not sent yet, and otherwise runs on in its pipeline,
// whose reply nobody reads: the caller's own command is what is queued, not
// a copy, so the caller must not read a command whose call returned its
// context's error. A pipeline runs under the latest deadline of the
// commands in it.
package coalesce

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// Client is what a Coalescer sends through: a *redis.Client or a
// *redis.ClusterClient (whose pipelines go to each command's node).
type Client interface {
	Process(ctx context.Context, cmd redis.Cmder) error
	Pipeline() redis.Pipeliner
}

// DefaultLanes is the number of lanes New gives a Coalescer for lanes 0.
const DefaultLanes = 2

// A Coalescer sends the commands of concurrent callers in shared pipelines;
// see the package documentation. It is safe for concurrent use and starts
// no goroutine while its lanes are idle.
type Coalescer struct {
	client Client
	lanes  []lane
	next   atomic.Uint32
}

// lane is one command or pipeline in flight at a time, and the commands
// queued behind it.
type lane struct {
	mu    sync.Mutex
	busy  bool
	queue []*entry
	spare []*entry     // the previous batch's slice, to queue into again
	n     atomic.Int32 // len(queue), read without the lock
	_     [64]byte     // keeps lanes on separate cache lines
}

// The states of an entry.
const (
	waiting   int32 = iota // queued or in flight, its caller waiting
	delivered              // its reply is final, its caller may read it
	abandoned              // its caller left; its reply is not read
)

// entry is a queued command.
type entry struct {
	ctx   context.Context
	cmd   redis.Cmder // its caller's: read only once delivered
	state atomic.Int32
	done  chan struct{} // closed once the lane is done with cmd
}

// New returns a Coalescer over client with lanes lanes (DefaultLanes when
// lanes is 0 or less).
func New(client Client, lanes int) *Coalescer {
	if lanes <= 0 {
		lanes = DefaultLanes
	}
	return &Coalescer{client: client, lanes: make([]lane, lanes)}
}

// ProcessUncopied sends cmd, at once on an idle lane, or else in the
// pipeline that follows a busy lane's command, and returns its error. When
// that is ctx's error (ctx ended while cmd was queued), cmd may still be
// sent, and written, in its lane's pipeline: the caller must not read it.
// A copy of each command would spare its caller that rule, at two
// allocations per call.
func (c *Coalescer) ProcessUncopied(ctx context.Context, cmd redis.Cmder) error {
	start := c.next.Add(1)
	n := uint32(len(c.lanes))
	for i := range n {
		if l := &c.lanes[(start+i)%n]; l.claim() {
			return c.direct(ctx, l, cmd)
		}
	}
	if err := ctx.Err(); err != nil {
		cmd.SetErr(err)
		return err
	}
	e := &entry{ctx: ctx, cmd: cmd, done: make(chan struct{})}
	l := c.shortest(start)
	if !l.enqueue(e) { // the lane became idle meanwhile
		return c.direct(ctx, l, cmd)
	}
	select {
	case <-e.done:
	case <-ctx.Done():
		if e.state.CompareAndSwap(waiting, abandoned) {
			return ctx.Err()
		}
		<-e.done
	}
	return cmd.Err()
}

// shortest returns the lane with the fewest commands queued, the first
// from start among equals: a lane whose command hangs keeps its queue, so
// the callers that come next queue behind the others.
func (c *Coalescer) shortest(start uint32) *lane {
	n := uint32(len(c.lanes))
	best := &c.lanes[start%n]
	least := best.n.Load()
	for i := uint32(1); i < n && least > 0; i++ {
		l := &c.lanes[(start+i)%n]
		if q := l.n.Load(); q < least {
			best, least = l, q
		}
	}
	return best
}

// direct sends cmd alone on l, which the caller claimed, and then hands what
// queued meanwhile to a goroutine.
func (c *Coalescer) direct(ctx context.Context, l *lane, cmd redis.Cmder) error {
	defer c.release(l)
	return c.client.Process(ctx, cmd)
}

// claim makes l busy and reports whether it was idle.
func (l *lane) claim() bool {
	l.mu.Lock()
	idle := !l.busy
	l.busy = true
	l.mu.Unlock()
	return idle
}

// enqueue queues e on l and reports true, or claims l and reports false
// when l is idle.
func (l *lane) enqueue(e *entry) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.busy {
		l.busy = true
		return false
	}
	l.queue = append(l.queue, e)
	l.n.Store(int32(len(l.queue)))
	return true
}

// take returns what is queued on l, or makes l idle and returns nil.
func (l *lane) take() []*entry {
	l.mu.Lock()
	defer l.mu.Unlock()
	batch := l.queue
	if len(batch) == 0 {
		l.busy = false
		return nil
	}
	l.queue, l.spare = l.spare[:0], nil
	l.n.Store(0)
	return batch
}

// recycle gives batch's slice back to l, cleared, to queue into.
func (l *lane) recycle(batch []*entry) {
	clear(batch)
	l.mu.Lock()
	l.spare = batch[:0]
	l.mu.Unlock()
}

// release ends the command l had in flight: what queued meanwhile goes to
// a goroutine that sends it, and the batches that queue behind those, until
// l is idle again.
func (c *Coalescer) release(l *lane) {
	if batch := l.take(); batch != nil {
		go c.drain(l, batch)
	}
}

// drain sends batch and each batch that queues behind it on l, until l is
// idle.
func (c *Coalescer) drain(l *lane, batch []*entry) {
	for batch != nil {
		c.send(batch)
		l.recycle(batch)
		batch = l.take()
	}
}

// send sends the commands of batch whose callers still wait, in one
// pipeline (or alone, for one), and delivers their replies.
func (c *Coalescer) send(batch []*entry) {
	live := 0
	var first *entry
	var deadline time.Time
	bounded := true
	for _, e := range batch {
		if e.state.Load() == abandoned {
			continue
		}
		live++
		if first == nil {
			first = e
		}
		if d, ok := e.ctx.Deadline(); !ok {
			bounded = false
		} else if d.After(deadline) {
			deadline = d
		}
	}
	if live > 0 {
		// The batch runs for every caller in it, so on none's context: on
		// the first one's values, until the latest deadline.
		ctx := context.WithoutCancel(first.ctx)
		cancel := context.CancelFunc(func() {})
		if bounded {
			ctx, cancel = context.WithDeadline(ctx, deadline)
		}
		if live == 1 {
			_ = c.client.Process(ctx, first.cmd)
		} else {
			pipe := c.client.Pipeline()
			for _, e := range batch {
				if e.state.Load() != abandoned {
					_ = pipe.Process(ctx, e.cmd)
				}
			}
			_, _ = pipe.Exec(ctx)
		}
		cancel()
	}
	for _, e := range batch {
		e.state.CompareAndSwap(waiting, delivered)
		close(e.done)
	}
}

// Cluster coalesces the commands of a *redis.ClusterClient per master: each
// master has lanes of its own, so that a master that hangs holds up only
// the commands of its own keys. It sends through the cluster client, which
// routes each command, and each pipeline's commands, to its key's node and
// follows redirections.
type Cluster struct {
	client *redis.ClusterClient
	lanes  int
	nodes  sync.Map // a master's address → its *Coalescer
}

// NewCluster returns a Cluster over client with lanes lanes per master
// (DefaultLanes when lanes is 0 or less).
func NewCluster(client *redis.ClusterClient, lanes int) *Cluster {
	return &Cluster{client: client, lanes: lanes}
}

// ProcessUncopied sends cmd through the lanes of its key's master (see
// Coalescer.ProcessUncopied); a command without a key, or whose master the
// client does not know, is sent at once.
func (c *Cluster) ProcessUncopied(ctx context.Context, cmd redis.Cmder) error {
	key, ok := firstKey(cmd)
	if !ok {
		return c.client.Process(ctx, cmd)
	}
	node, err := c.client.MasterForKey(ctx, key)
	if err != nil {
		return c.client.Process(ctx, cmd)
	}
	addr := node.Options().Addr
	co, found := c.nodes.Load(addr)
	if !found {
		co, _ = c.nodes.LoadOrStore(addr, New(c.client, c.lanes))
	}
	return co.(*Coalescer).ProcessUncopied(ctx, cmd)
}

// firstKey returns the key of cmd: the first after the script and the key
// count of EVAL and EVALSHA (and their read-only forms), else its first
// argument.
func firstKey(cmd redis.Cmder) (string, bool) {
	args := cmd.Args()
	pos := 1
	switch cmd.Name() {
	case "eval", "evalsha", "eval_ro", "evalsha_ro":
		pos = 3
	}
	if len(args) <= pos {
		return "", false
	}
	switch k := args[pos].(type) {
	case string:
		return k, true
	case *string:
		return *k, true
	}
	return "", false
}
