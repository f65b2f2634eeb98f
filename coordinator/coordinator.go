package coordinator

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/idemkit/idempotency/coordinator/idemevent"
	"github.com/idemkit/idempotency/coordinator/idemstore"
	"github.com/idemkit/idempotency/internal/unprotected"
)

// Coordinator runs actions once per idempotency key. Create one with New and
// share it: it is safe for concurrent use, and callers in one process that
// wait on the same key share one poll loop. Calls go through Do, DoResult,
// DoWithCodec or Execute.
type Coordinator struct {
	store  idemstore.Store
	fencer idemstore.Fencer     // store, when it hands out fences; nil otherwise
	tx     idemstore.Transactor // store, when it claims keys in transactions; nil otherwise
	order  readOrder            // over tx: whether a call reads before it claims
	cfg    config
	obs    idemevent.Observer
	// deadlines are the storage timeout's shared deadlines (see begin).
	deadlines *deadlines

	mu    sync.Mutex
	polls map[idemstore.Key]*poll
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
func New(store idemstore.Store, opts ...Option) (*Coordinator, error) {
	if store == nil {
		return nil, errors.New("idempotency: invalid coordinator configuration: store is nil")
	}
	cfg, err := newConfig(opts)
	if err != nil {
		return nil, err
	}
	fencer, _ := store.(idemstore.Fencer)
	if cfg.fenced != nil && fencer == nil {
		return nil, fmt.Errorf("idempotency: invalid coordinator configuration: %w", &OptionError{Option: "WithFencedOperations",
			Err: fmt.Errorf("the store (%T) hands out no fences: it does not implement coordinator.Fencer", store)})
	}
	tx, _ := store.(idemstore.Transactor)
	c := &Coordinator{store: store, fencer: fencer, tx: tx, cfg: cfg, obs: cfg.observer, polls: make(map[idemstore.Key]*poll),
		deadlines: newDeadlines(cfg.storageTimeout)}
	c.idle = sync.NewCond(&c.mu)
	return c, nil
}

// Close waits until the coordinator's background work (shared poll loops,
// retried saves, releases) has ended, which takes at most one lease after a
// save's last confirmed renewal (Shutdown bounds the wait). It does not
// stop calls in progress, the Coordinator stays usable, and it returns nil.
func (c *Coordinator) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	for c.bg > 0 {
		c.idle.Wait()
	}
	return nil
}

// Shutdown is Close bounded by ctx: it waits until the background work has
// ended or ctx is done, and then returns an error that says how much was
// still running (wrapping ctx's error). Work it stops waiting for goes on:
// a retried save that the process outlives still stores its result, and
// one it does not leaves the key to free itself when its lease runs out.
func (c *Coordinator) Shutdown(ctx context.Context) error {
	stop := context.AfterFunc(ctx, func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		c.idle.Broadcast()
	})
	defer stop()
	c.mu.Lock()
	defer c.mu.Unlock()
	for c.bg > 0 && ctx.Err() == nil {
		c.idle.Wait()
	}
	if c.bg > 0 {
		return fmt.Errorf("idempotency: stopped waiting for %d background tasks of the coordinator (retried saves, releases, poll loops): %w", c.bg, context.Cause(ctx))
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

// The adapters report a call without a key through the internal bridge, so
// that no code outside the library can report an event.
func init() {
	unprotected.Report = func(c any, ctx context.Context, operation string) {
		c.(*Coordinator).reportUnprotected(ctx, operation)
	}
}

// reportUnprotected reports an idemevent.Unprotected (Method
// idemevent.MethodNone) for an action of operation that runs without a key,
// so that metrics count what Do never saw; it reports nothing when the kill
// switch is off or operation is invalid.
func (c *Coordinator) reportUnprotected(ctx context.Context, operation string) {
	if !c.cfg.enabled || ValidateOperation(operation) != nil {
		return
	}
	c.obs.Observe(ctx, idemevent.Event{Kind: idemevent.Unprotected, Key: idemstore.Key{Operation: operation}, Method: idemevent.MethodNone})
}

// Enabled reports whether the coordinator protects calls (WithEnabled), so
// that an adapter can skip work such as fingerprinting when it does not.
func (c *Coordinator) Enabled() bool { return c.cfg.enabled }
