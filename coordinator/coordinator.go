package coordinator

import (
	"context"
	"errors"
	"sync"
)

// Coordinator runs actions once per idempotency key. Create one with New and
// share it: it is safe for concurrent use, and callers in one process that
// wait on the same key share one poll loop. Calls go through Do, DoResult,
// DoWithCodec or Execute.
type Coordinator struct {
	store Store
	cfg   config
	obs   Observer

	mu    sync.Mutex
	polls map[Key]*poll
	bg    int        // running background goroutines (poll loops, saves, releases); guarded by mu
	idle  *sync.Cond // on mu: broadcast when bg drops to 0
	// cleanups counts the background releases of refused calls in flight;
	// guarded by mu. See releaseLater.
	cleanups int
}

// New returns a Coordinator over store. It returns an error, and no
// Coordinator, when store is nil or an option's value is refused: a mode is
// unknown, or a duration or limit makes no sense. The error names every
// refused option, each as an *OptionError.
func New(store Store, opts ...Option) (*Coordinator, error) {
	if store == nil {
		return nil, errors.New("idempotency: invalid coordinator configuration: store is nil")
	}
	cfg, err := newConfig(opts)
	if err != nil {
		return nil, err
	}
	c := &Coordinator{store: store, cfg: cfg, obs: cfg.observer, polls: make(map[Key]*poll)}
	c.idle = sync.NewCond(&c.mu)
	return c, nil
}

// Close waits until the coordinator's background work has ended: the poll
// loops that waiting callers shared, the saves of results whose first
// completion failed, and the releases of reservations whose Reserve timed
// out. A poll loop exits within one storage timeout once its last waiter has
// left; a release within one storage timeout; a save when its result is
// stored, or when the lease may have expired (at most one lease after its
// last confirmed renewal). Close lets an application (the fx module does it
// on stop) or a test with goleak wait for that. It does not stop calls in
// progress, and the Coordinator stays usable. It returns nil.
func (c *Coordinator) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	for c.bg > 0 {
		c.idle.Wait()
	}
	return nil
}

// background runs f on a goroutine that Close waits for.
func (c *Coordinator) background(f func()) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.backgroundLocked(f)
}

// backgroundLocked is background with c.mu held.
func (c *Coordinator) backgroundLocked(f func()) {
	c.bg++
	go func() {
		defer func() {
			c.mu.Lock()
			c.bg--
			if c.bg == 0 {
				c.idle.Broadcast()
			}
			c.mu.Unlock()
		}()
		f()
	}()
}

// ReportUnprotected reports to the Observer that the caller runs an action
// of operation without protection because it has no idempotency key (an
// EventUnprotected with Method MethodNone), so that metrics and logs count
// what Do never saw. The HTTP middleware calls it for a request without an
// Idempotency-Key header when the header is optional. It reports nothing
// when the kill switch is off, or when operation is not a valid operation
// name.
func (c *Coordinator) ReportUnprotected(ctx context.Context, operation string) {
	if !c.cfg.enabled || ValidateOperation(operation) != nil {
		return
	}
	c.obs.Observe(ctx, Event{Kind: EventUnprotected, Key: Key{Operation: operation}, Method: MethodNone})
}

// Enabled reports whether the coordinator protects calls (see WithEnabled).
// A caller that does extra work only for protected calls (the HTTP
// middleware fingerprints the request body) can skip it when this is false.
func (c *Coordinator) Enabled() bool { return c.cfg.enabled }
