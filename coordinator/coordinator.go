package coordinator

import (
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
	loops int        // running poll loops; guarded by mu
	idle  *sync.Cond // on mu: broadcast when loops drops to 0
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

// Close waits until the poll loops that waiting callers shared have exited.
// A loop stops when its last waiter leaves, and exits once its read in flight
// returns, within one storage timeout; Close lets an application (the fx
// module does it on stop) or a test with goleak wait for that. It does not
// stop calls in progress, and the Coordinator stays usable. It returns nil.
func (c *Coordinator) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	for c.loops > 0 {
		c.idle.Wait()
	}
	return nil
}

// Enabled reports whether the coordinator protects calls (see WithEnabled).
// A caller that does extra work only for protected calls (the HTTP
// middleware fingerprints the request body) can skip it when this is false.
func (c *Coordinator) Enabled() bool { return c.cfg.enabled }
