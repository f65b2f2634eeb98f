package coordinator

import (
	"context"
	"time"
)

// poll is one shared poll loop: every caller in this process that waits on
// the same key joins it instead of polling the store itself.
type poll struct {
	refs   int           // waiters; guarded by Coordinator.mu
	kick   chan struct{} // poll now: a holder in this process finished
	done   chan struct{} // closed when rec/err are set
	rec    Record        // the first record that is not pending
	err    error         // or the store failure that ended the loop
	cancel context.CancelFunc
	exited chan struct{}
}

// wait waits until the record under the key is no longer pending and returns
// it: completed, unreadable or absent. It returns an *InProgressError at the
// deadline, a *StorageError when a poll fails, or ctx's error.
func (x *exec) wait(ctx context.Context, deadline time.Time, last Record) (Record, error) {
	c := x.c
	start := time.Now()
	outcome := WaitError
	defer func() {
		x.observe(ctx, Event{Kind: EventWaited, Duration: time.Since(start), Outcome: outcome})
	}()
	p := c.joinPoll(ctx, x)
	defer c.leavePoll(x.key, p)

	timer := time.NewTimer(time.Until(deadline))
	defer timer.Stop()
	select {
	case <-p.done:
		switch {
		case p.err != nil:
			outcome = WaitError
		case p.rec.State == StateAbsent:
			outcome = WaitTakeover
		case x.fp != "" && p.rec.Fingerprint != "" && x.fp != p.rec.Fingerprint:
			outcome = WaitReuse
		default:
			outcome = WaitHit
		}
		return p.rec, p.err
	case <-ctx.Done():
		outcome = WaitCanceled
		return Record{}, ctx.Err()
	case <-timer.C:
		outcome = WaitTimeout
		return Record{}, &InProgressError{Key: x.key, RetryAfter: last.TTL}
	}
}

func (c *Coordinator) joinPoll(ctx context.Context, x *exec) *poll {
	c.mu.Lock()
	defer c.mu.Unlock()
	if p, ok := c.polls[x.key]; ok {
		p.refs++
		return p
	}
	pctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	p := &poll{refs: 1, kick: make(chan struct{}, 1), done: make(chan struct{}), cancel: cancel, exited: make(chan struct{})}
	c.polls[x.key] = p
	go c.runPoll(pctx, x, p)
	return p
}

// leavePoll drops a waiter; the last one stops the loop and waits for it, so
// no goroutine outlives the calls that needed it.
func (c *Coordinator) leavePoll(key Key, p *poll) {
	c.mu.Lock()
	p.refs--
	last := p.refs == 0
	if last && c.polls[key] == p {
		delete(c.polls, key)
	}
	c.mu.Unlock()
	if last {
		p.cancel()
		<-p.exited
	}
}

// kick makes the key's poll loop, if any, read at once.
func (c *Coordinator) kick(key Key) {
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
	maxInterval := max(DefaultMaxPoll, interval)
	timer := time.NewTimer(interval)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
		case <-p.kick:
		}
		rec, err := x.storeGet(ctx)
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			err = x.storageFailed(ctx, ErrorStorageGet, MethodGet, err)
		}
		if err != nil || rec.State != StatePending {
			c.mu.Lock()
			p.rec, p.err = rec, err
			if c.polls[x.key] == p {
				delete(c.polls, x.key) // later waiters start a fresh loop
			}
			c.mu.Unlock()
			close(p.done)
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
