package coordinator

import (
	"context"
	"errors"
	"time"

	"github.com/idemkit/idempotency/coordinator/idemevent"
	"github.com/idemkit/idempotency/coordinator/idemstore"
)

// poll is one shared poll loop: every caller in this process that waits on
// the same key joins it instead of polling the store itself.
type poll struct {
	refs   int              // waiters; guarded by Coordinator.mu
	kick   chan struct{}    // poll now: a holder in this process finished
	done   chan struct{}    // closed when rec/err are set
	rec    idemstore.Record // the first record that is not pending
	err    error            // or the store failure that ended the loop
	ttl    time.Duration    // the holder's remaining lease at the last read; guarded by Coordinator.mu
	cancel context.CancelFunc
	exited chan struct{}
}

// wait waits until the record under the key is no longer pending and returns
// it: completed, unreadable or absent. It returns an *InProgressError at the
// deadline, a *StorageError when a poll fails, or ctx's error.
func (x *exec) wait(ctx context.Context, deadline time.Time, last idemstore.Record) (idemstore.Record, error) {
	c := x.c
	start := time.Now()
	outcome := idemevent.WaitError
	defer func() {
		x.observe(ctx, idemevent.Event{Kind: idemevent.Waited, Duration: time.Since(start), Outcome: outcome})
	}()
	p := c.joinPoll(ctx, x, last)
	defer c.leavePoll(x.key, p)

	timer := time.NewTimer(time.Until(deadline))
	defer timer.Stop()
	select {
	case <-p.done:
		switch {
		case p.err != nil:
			outcome = idemevent.WaitError
		case p.rec.State == idemstore.StateAbsent:
			outcome = idemevent.WaitTakeover
		case x.reusedBy(p.rec):
			outcome = idemevent.WaitReuse
		default:
			outcome = idemevent.WaitHit
		}
		return p.rec, p.err
	case <-ctx.Done():
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			// The caller's deadline is the wait bound here: the key is
			// still in progress, which is what the caller needs to hear.
			outcome = idemevent.WaitTimeout
			return idemstore.Record{}, x.inProgress(c.lastTTL(p))
		}
		outcome = idemevent.WaitCanceled
		return idemstore.Record{}, ctx.Err()
	case <-timer.C:
		outcome = idemevent.WaitTimeout
		return idemstore.Record{}, x.inProgress(c.lastTTL(p))
	}
}

func (c *Coordinator) joinPoll(ctx context.Context, x *exec, last idemstore.Record) *poll {
	c.mu.Lock()
	defer c.mu.Unlock()
	if p, ok := c.polls[x.key]; ok {
		p.refs++
		return p
	}
	pctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	p := &poll{refs: 1, kick: make(chan struct{}, 1), done: make(chan struct{}), cancel: cancel, exited: make(chan struct{}), ttl: last.TTL}
	c.polls[x.key] = p
	c.backgroundLocked(func() { c.runPoll(pctx, x, p) })
	return p
}

func (c *Coordinator) lastTTL(p *poll) time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	return p.ttl
}

// leavePoll drops a waiter; the last one stops the loop. It does not wait
// for the loop to exit: a read in flight may take up to the storage timeout
// (go-redis bounds a read by the deadline, not by cancellation), and a
// cancelled caller returns at once. The loop is the Coordinator's: Close
// waits for it.
func (c *Coordinator) leavePoll(key idemstore.Key, p *poll) {
	c.mu.Lock()
	p.refs--
	last := p.refs == 0
	if last && c.polls[key] == p {
		delete(c.polls, key)
	}
	c.mu.Unlock()
	if last {
		p.cancel()
	}
}

// kick makes the key's poll loop, if any, read at once.
func (c *Coordinator) kick(key idemstore.Key) {
	c.mu.Lock()
	p := c.polls[key]
	c.mu.Unlock()
	if p != nil {
		select {
		case p.kick <- struct{}{}:
		default:
		}
	}
}

// runPoll reads the key with exponential backoff until it is no longer
// pending or the store fails, then publishes what it found.
func (c *Coordinator) runPoll(ctx context.Context, x *exec, p *poll) {
	defer close(p.exited)
	interval := c.cfg.pollInterval
	maxInterval := max(maxPoll, interval)
	// An idemstore.Watcher store tells us when the holder finishes, from any process:
	// read (and watch) at once, then wait for its notice or the next poll.
	var changed <-chan struct{}
	if w, ok := c.store.(idemstore.Watcher); ok {
		rec, ch, stop, err := x.storeWatch(ctx, w)
		if stop != nil {
			defer stop()
		}
		if ctx.Err() != nil || c.settled(ctx, x, p, rec, err) {
			return
		}
		changed = ch
	}
	timer := time.NewTimer(interval)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
		case <-p.kick:
		case <-changed:
		}
		rec, err := x.storeGet(ctx)
		if ctx.Err() != nil || c.settled(ctx, x, p, rec, err) {
			return
		}
		interval = min(interval*2, maxInterval)
		if !timer.Stop() {
			select {
			case <-timer.C:
			default:
			}
		}
		timer.Reset(interval)
	}
}

// settled publishes what a read of the poll loop found, if it ends the wait:
// a failure, or a record that is not pending. Otherwise it keeps the
// holder's remaining lease, and the loop goes on.
func (c *Coordinator) settled(ctx context.Context, x *exec, p *poll, rec idemstore.Record, err error) bool {
	if err != nil {
		err = x.storageFailed(ctx, idemevent.ErrorStorageGet, idemevent.MethodGet, err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if err == nil && rec.State == idemstore.StatePending {
		p.ttl = rec.TTL
		return false
	}
	p.rec, p.err = rec, err
	if c.polls[x.key] == p {
		delete(c.polls, x.key) // later waiters start a fresh loop
	}
	close(p.done)
	return true
}
