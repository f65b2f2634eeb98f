package faultstore

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/idemkit/idempotency/coordinator/idemevent"
	"github.com/idemkit/idempotency/coordinator/idemstore"
)

// ErrInjected is the error a failing call returns when no other error was
// given.
var ErrInjected = errors.New("faultstore: injected failure")

// Hook runs before a call of a Store method, with the call's context and key.
// A non-nil error fails the call with that error, which then does not reach
// the inner store. A Hook may block (honouring ctx, as a slow network
// would), and may call the inner store or the Store itself.
type Hook func(ctx context.Context, key idemstore.Key) error

// Store is an idemstore.Store that passes calls to an inner store and fails
// them on demand. Create one with Wrap. Its methods are safe for concurrent
// use.
//
// Each call of a store method is counted, then runs the method's Hook if it
// has one, then fails if a failure is armed for the method, and otherwise
// goes to the inner store. A call failed by a Hook, Fail, FailOnce or
// FailTimes does not reach the inner store; one failed by LoseReplies does,
// and fails after it.
type Store struct {
	inner idemstore.Store

	mu    sync.Mutex
	rules map[idemevent.Method]rule
	hooks map[idemevent.Method]Hook
	calls map[idemevent.Method]int
}

// rule is an armed failure: the next n calls fail with err; n < 0 means
// every call. An after rule lets the call reach the inner store first.
type rule struct {
	n     int
	err   error
	after bool
}

var _ idemstore.Store = (*Store)(nil)

// Wrap returns a Store that passes every call to inner until told to fail.
func Wrap(inner idemstore.Store) *Store {
	s := &Store{inner: inner}
	s.Reset()
	return s
}

// Fail makes every call of method fail with err (ErrInjected when err is
// nil), until Reset or another Fail, FailOnce, FailTimes or LoseReplies for
// method.
func (s *Store) Fail(method idemevent.Method, err error) { s.arm(method, -1, err, false) }

// FailOnce makes the next call of method fail with err (ErrInjected when err
// is nil); the calls after it pass. It replaces what was armed for method.
func (s *Store) FailOnce(method idemevent.Method, err error) { s.arm(method, 1, err, false) }

// FailTimes makes the next n calls of method fail with err (ErrInjected when
// err is nil); the calls after them pass. It replaces what was armed for
// method; n <= 0 disarms it.
func (s *Store) FailTimes(method idemevent.Method, n int, err error) {
	s.arm(method, max(n, 0), err, false)
}

// LoseReplies makes the next n calls of method reach the inner store, which
// does the step, and then return err (ErrInjected when err is nil) instead of
// the inner store's answer: a reply lost on its way back, or a client that
// timed out after the server acted. A Reserve whose reply is lost has
// reserved the key; a Complete has stored the result. It replaces what was
// armed for method; n <= 0 disarms it.
func (s *Store) LoseReplies(method idemevent.Method, n int, err error) {
	s.arm(method, max(n, 0), err, true)
}

func (s *Store) arm(method idemevent.Method, n int, err error, after bool) {
	if err == nil {
		err = ErrInjected
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if n == 0 {
		delete(s.rules, method)
		return
	}
	s.rules[method] = rule{n: n, err: err, after: after}
}

// Before sets the Hook that runs before each call of method, replacing any
// earlier one; nil removes it.
func (s *Store) Before(method idemevent.Method, hook Hook) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if hook == nil {
		delete(s.hooks, method)
		return
	}
	s.hooks[method] = hook
}

// Calls returns how many times method was called since Wrap or Reset,
// failed calls included.
func (s *Store) Calls(method idemevent.Method) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.calls[method]
}

// Reset disarms every failure, removes every Hook and zeroes the call
// counts: the Store is as Wrap returned it.
func (s *Store) Reset() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.rules = make(map[idemevent.Method]rule)
	s.hooks = make(map[idemevent.Method]Hook)
	s.calls = make(map[idemevent.Method]int)
}

// enter counts a call of method, runs its Hook and takes one armed failure.
// A non-nil err fails the call before it reaches the inner store; a non-nil
// lost replaces the inner store's answer.
func (s *Store) enter(ctx context.Context, method idemevent.Method, key idemstore.Key) (lost, err error) {
	hook := s.count(method)
	if hook != nil {
		if err := hook(ctx, key); err != nil {
			return nil, err
		}
	}
	return s.take(method)
}

// count counts a call of method and returns its Hook.
func (s *Store) count(method idemevent.Method) Hook {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls[method]++
	return s.hooks[method]
}

// take takes one armed failure of method; see enter.
func (s *Store) take(method idemevent.Method) (lost, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r, ok := s.rules[method]
	if !ok {
		return nil, nil
	}
	switch {
	case r.n < 0: // always
	case r.n == 1:
		delete(s.rules, method)
	default:
		r.n--
		s.rules[method] = r
	}
	if r.after {
		return r.err, nil
	}
	return nil, r.err
}

// Reserve calls the inner store's Reserve unless the call fails before it;
// see Store.
func (s *Store) Reserve(ctx context.Context, key idemstore.Key, w idemstore.Write) (idemstore.Record, bool, error) {
	lost, err := s.enter(ctx, idemevent.MethodReserve, key)
	if err != nil {
		return idemstore.Record{}, false, err
	}
	rec, ok, err := s.inner.Reserve(ctx, key, w)
	if lost != nil {
		return idemstore.Record{}, false, lost
	}
	return rec, ok, err
}

// ReserveFenced calls the inner store's ReserveFenced unless the call fails
// before it, as Reserve does (its faults are Reserve's, under
// idemevent.MethodReserve); see Store. It returns an error when the inner
// store is not an idemstore.Fencer.
func (s *Store) ReserveFenced(ctx context.Context, key idemstore.Key, w idemstore.Write) (idemstore.Record, uint64, bool, error) {
	f, ok := s.inner.(idemstore.Fencer)
	if !ok {
		return idemstore.Record{}, 0, false, fmt.Errorf("faultstore: the inner store (%T) hands out no fences", s.inner)
	}
	lost, err := s.enter(ctx, idemevent.MethodReserve, key)
	if err != nil {
		return idemstore.Record{}, 0, false, err
	}
	rec, fence, written, err := f.ReserveFenced(ctx, key, w)
	if lost != nil {
		return idemstore.Record{}, 0, false, lost
	}
	return rec, fence, written, err
}

// Get calls the inner store's Get unless the call fails before it;
// see Store.
func (s *Store) Get(ctx context.Context, key idemstore.Key) (idemstore.Record, error) {
	lost, err := s.enter(ctx, idemevent.MethodGet, key)
	if err != nil {
		return idemstore.Record{}, err
	}
	rec, err := s.inner.Get(ctx, key)
	if lost != nil {
		return idemstore.Record{}, lost
	}
	return rec, err
}

// Complete calls the inner store's Complete unless the call fails before it;
// see Store.
func (s *Store) Complete(ctx context.Context, key idemstore.Key, token string, c idemstore.Completion) (bool, error) {
	lost, err := s.enter(ctx, idemevent.MethodComplete, key)
	if err != nil {
		return false, err
	}
	ok, err := s.inner.Complete(ctx, key, token, c)
	if lost != nil {
		return false, lost
	}
	return ok, err
}

// Release calls the inner store's Release unless the call fails before it;
// see Store.
func (s *Store) Release(ctx context.Context, key idemstore.Key, token string) (bool, error) {
	lost, err := s.enter(ctx, idemevent.MethodRelease, key)
	if err != nil {
		return false, err
	}
	ok, err := s.inner.Release(ctx, key, token)
	if lost != nil {
		return false, lost
	}
	return ok, err
}

// Renew calls the inner store's Renew unless the call fails before it;
// see Store.
func (s *Store) Renew(ctx context.Context, key idemstore.Key, token string, lease time.Duration) (bool, error) {
	lost, err := s.enter(ctx, idemevent.MethodRenew, key)
	if err != nil {
		return false, err
	}
	ok, err := s.inner.Renew(ctx, key, token, lease)
	if lost != nil {
		return false, lost
	}
	return ok, err
}
