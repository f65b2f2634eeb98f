package coordinator

import (
	"context"
	"time"
)

// A Plan is what the coordinator's settings decide for one call before any
// store call: the key, its TTL and how to behave while another caller holds
// the key. It is for a store with a call path of its own (idempg.Do runs the
// action in the store's transaction) that must follow the same settings as
// Do; an application calling Do never needs one.
type Plan struct {
	// Key is the call's operation and key.
	Key Key
	// Fingerprint is the call's fingerprint, "" for none.
	Fingerprint string
	// TTL is how long the result is kept: the operator's per-operation TTL,
	// else the call's, else the default, within the TTL bounds.
	TTL time.Duration
	// Token is a fresh owner token, as Do makes one per call.
	Token string
	// InFlight is the in-flight mode (WithInFlight).
	InFlight InFlightMode
	// WaitTimeout bounds a wait for another caller in mode wait
	// (WithWaitTimeout, else the lease).
	WaitTimeout time.Duration
	// PollInterval is the first interval between reads of a wait
	// (WithPollInterval).
	PollInterval time.Duration
	// MaxResultBytes is the largest encoded result that is kept
	// (WithMaxResultBytes).
	MaxResultBytes int
}

// Plan validates call as Do does and returns what the settings decide for
// it; the error is Do's for an invalid call (ErrInvalidRequest). It reads
// nothing and reports nothing.
func (c *Coordinator) Plan(call Call) (Plan, error) {
	ttl, err := c.check(call)
	if err != nil {
		return Plan{}, err
	}
	x := exec{key: Key{Operation: call.Operation, Key: call.Key}}
	x.newToken()
	return Plan{
		Key:            x.key,
		Fingerprint:    call.Fingerprint,
		TTL:            ttl,
		Token:          string(x.tok[:]),
		InFlight:       c.cfg.inFlight,
		WaitTimeout:    c.cfg.waitTimeout,
		PollInterval:   c.cfg.pollInterval,
		MaxResultBytes: c.cfg.maxResultBytes,
	}, nil
}

// Store returns the store the coordinator was created with.
func (c *Coordinator) Store() Store { return c.store }

// Report sends e to the coordinator's observer (WithObserver), as its own
// calls do, so that a store's own call path (see Plan) feeds the same
// metrics, logs and spans. It reports nothing when the kill switch is off.
func (c *Coordinator) Report(ctx context.Context, e Event) {
	if c.cfg.enabled {
		c.obs.Observe(ctx, e)
	}
}
