package memstore

import (
	"bytes"
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/idemkit/idempotency/coordinator/idemstore"
)

// Store is an in-memory idemstore.Store. Create one with New; the zero
// value is not usable. It is safe for concurrent use.
//
// Expired records are absent: every method treats a record whose time to
// live has run out on the Store's clock as if it were not there, and removes
// it. Results are copied in and out, so neither the caller of Complete nor
// the reader of a Record can change what the Store holds.
//
// Methods that take a context return ctx.Err() without doing anything when
// the context is already done, as a networked store would. Reserve,
// Complete and Renew return an error for a time to live that is not
// positive, Reserve for a Write whose State is not pending, completed or
// not replayable, and Complete for a Completion whose State is not completed
// or not replayable: the coordinator never sends those, so they point at a
// bug in the caller.
type Store struct {
	now func() time.Time

	mu      sync.Mutex
	records map[idemstore.Key]entry
	// fences is the last fence handed out per key (ReserveFenced); never
	// swept, so that fences only grow.
	fences map[idemstore.Key]uint64
	// sweepAt is the number of records at which the next write sweeps out
	// the expired ones, so that keys nobody reads again do not pile up.
	sweepAt int
}

// entry is a stored record. Its TTL field is unused: expires is the
// deadline, and the zero time means the record never expires.
type entry struct {
	rec     idemstore.Record
	expires time.Time
	fence   uint64 // the fence of a fenced reservation, else 0
}

const minSweep = 1024

var _ idemstore.Store = (*Store)(nil)

// New returns an empty Store. Without options it uses time.Now as its clock.
func New(opts ...Option) *Store {
	c := config{now: time.Now}
	for _, o := range opts {
		if o != nil {
			o.apply(&c)
		}
	}
	if c.now == nil {
		c.now = time.Now
	}
	return &Store{
		now:     c.now,
		records: make(map[idemstore.Key]entry),
		sweepAt: minSweep,
	}
}

// Reserve implements idemstore.Store: if the key is absent, or w.Replace is
// set and the record under the key is not pending and has token
// w.ReplaceToken, it writes w with time to live w.TTL and returns
// (idemstore.Record{}, true, nil); otherwise it returns the record under the
// key and false.
func (s *Store) Reserve(ctx context.Context, key idemstore.Key, w idemstore.Write) (idemstore.Record, bool, error) {
	rec, _, written, err := s.reserve(ctx, key, w, false)
	return rec, written, err
}

// ReserveFenced implements idemstore.Fencer: it is Reserve, and the
// pending record it writes gets the key's next fence, one more than the last.
// The Store keeps the last fence of every key it ever fenced, for as long as
// the Store lives, so fences grow across expiry, release and takeover.
func (s *Store) ReserveFenced(ctx context.Context, key idemstore.Key, w idemstore.Write) (idemstore.Record, uint64, bool, error) {
	if w.State != idemstore.StatePending {
		return idemstore.Record{}, 0, false, fmt.Errorf("memstore: reserve fenced %s: write state is %s, want pending", key, w.State)
	}
	return s.reserve(ctx, key, w, true)
}

func (s *Store) reserve(ctx context.Context, key idemstore.Key, w idemstore.Write, fenced bool) (idemstore.Record, uint64, bool, error) {
	if err := ctx.Err(); err != nil {
		return idemstore.Record{}, 0, false, err
	}
	if err := checkWrite(key, w); err != nil {
		return idemstore.Record{}, 0, false, err
	}

	s.mu.Lock()
	defer s.mu.Unlock()
	rec, fence, written := s.reserveLocked(key, w, fenced, s.now())
	return rec, fence, written, nil
}

// reserveLocked is reserve on checked arguments. s.mu must be held.
func (s *Store) reserveLocked(key idemstore.Key, w idemstore.Write, fenced bool, now time.Time) (idemstore.Record, uint64, bool) {
	if e, ok := s.lookup(key, now); ok {
		replaceable := w.Replace && e.rec.State != idemstore.StatePending && e.rec.Token == w.ReplaceToken
		if !replaceable {
			var fence uint64
			if fenced && e.rec.State == idemstore.StatePending && e.rec.Token == w.Token {
				fence = e.fence
			}
			return e.out(now), fence, false
		}
	}
	rec := idemstore.Record{State: w.State, Token: w.Token, Fingerprint: w.Fingerprint}
	if final(w.State) {
		rec.Result = bytes.Clone(w.Result)
	}
	e := entry{rec: rec, expires: now.Add(w.TTL)}
	if fenced {
		if s.fences == nil {
			s.fences = make(map[idemstore.Key]uint64)
		}
		s.fences[key]++
		e.fence = s.fences[key]
	}
	s.store(key, e, now)
	return idemstore.Record{}, e.fence, true
}

// checkWrite returns an error for a write the coordinator never sends.
func checkWrite(key idemstore.Key, w idemstore.Write) error {
	if w.State != idemstore.StatePending && !final(w.State) {
		return fmt.Errorf("memstore: reserve %s: write state is %s, want pending, completed or not_replayable", key, w.State)
	}
	return checkTTL("reserve", key, w.TTL)
}

// Get implements idemstore.Store: it returns the record under key, or a
// Record with State idemstore.StateAbsent.
func (s *Store) Get(ctx context.Context, key idemstore.Key) (idemstore.Record, error) {
	if err := ctx.Err(); err != nil {
		return idemstore.Record{}, err
	}
	return s.Snapshot(key), nil
}

// Complete implements idemstore.Store: if key holds a pending record owned
// by token, it makes it a record in state c.State with c.Result (copied) and
// time to live c.TTL, keeping its token and fingerprint, and reports true.
func (s *Store) Complete(ctx context.Context, key idemstore.Key, token string, c idemstore.Completion) (bool, error) {
	if !final(c.State) {
		return false, fmt.Errorf("memstore: complete %s: state is %s, want completed or not_replayable", key, c.State)
	}
	return s.extendOwned(ctx, "complete", key, token, c.TTL, completion(c))
}

// completion returns the change Complete makes to a pending entry.
func completion(c idemstore.Completion) func(*entry) {
	return func(e *entry) {
		e.rec.State = c.State
		e.rec.Result = bytes.Clone(c.Result)
	}
}

// final reports whether st is a state a completion writes.
func final(st idemstore.State) bool {
	return st == idemstore.StateCompleted || st == idemstore.StateNotReplayable
}

// Release implements idemstore.Store: if key holds a pending record owned by
// token, it deletes it and reports true.
func (s *Store) Release(ctx context.Context, key idemstore.Key, token string) (bool, error) {
	if err := ctx.Err(); err != nil {
		return false, err
	}

	s.mu.Lock()
	defer s.mu.Unlock()
	return s.releaseLocked(key, token, s.now()), nil
}

// releaseLocked is Release. s.mu must be held.
func (s *Store) releaseLocked(key idemstore.Key, token string, now time.Time) bool {
	if _, ok := s.owned(key, token, now); !ok {
		return false
	}
	delete(s.records, key)
	return true
}

// Renew implements idemstore.Store: if key holds a pending record owned by
// token, it sets its time to live to lease and reports true.
func (s *Store) Renew(ctx context.Context, key idemstore.Key, token string, lease time.Duration) (bool, error) {
	return s.extendOwned(ctx, "renew", key, token, lease, nil)
}

// extendOwned is Complete and Renew: if key holds a pending record owned by
// token, it applies change (when not nil), sets the time to live to ttl and
// reports true.
func (s *Store) extendOwned(ctx context.Context, method string, key idemstore.Key, token string, ttl time.Duration, change func(*entry)) (bool, error) {
	if err := ctx.Err(); err != nil {
		return false, err
	}
	if err := checkTTL(method, key, ttl); err != nil {
		return false, err
	}

	s.mu.Lock()
	defer s.mu.Unlock()
	return s.extendLocked(key, token, ttl, change, s.now()), nil
}

// extendLocked is extendOwned on checked arguments. s.mu must be held.
func (s *Store) extendLocked(key idemstore.Key, token string, ttl time.Duration, change func(*entry), now time.Time) bool {
	e, ok := s.owned(key, token, now)
	if !ok {
		return false
	}
	if change != nil {
		change(&e)
	}
	e.expires = now.Add(ttl)
	s.records[key] = e
	return true
}

// Put stores rec under key as it is, whatever its State, replacing any
// record there, for tests that need a record the coordinator would not
// write: another caller's pending reservation, a completed result, or a
// idemstore.StateUnreadable record standing for corrupt bytes. rec.TTL is
// the record's time to live; 0 or less means it never expires. A rec with
// State idemstore.StateAbsent deletes the key. rec.Result is copied.
func (s *Store) Put(key idemstore.Key, rec idemstore.Record) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	if rec.State == idemstore.StateAbsent {
		delete(s.records, key)
		return
	}
	e := entry{rec: rec}
	e.rec.Result = bytes.Clone(rec.Result)
	e.rec.TTL = 0
	if rec.TTL > 0 {
		e.expires = now.Add(rec.TTL)
	}
	s.store(key, e, now)
}

// Snapshot returns the record under key as Get would, without a context: a
// Record with State idemstore.StateAbsent when there is none or it has
// expired. Its TTL is the remaining time to live, or 0 for a record that
// never expires. Its Result is a copy.
func (s *Store) Snapshot(key idemstore.Key) idemstore.Record {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	e, ok := s.lookup(key, now)
	if !ok {
		return idemstore.Record{}
	}
	return e.out(now)
}

// Len returns the number of keys that hold a record that has not expired.
func (s *Store) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.sweep(s.now())
	return len(s.records)
}

// lookup returns the live entry under key, deleting it if it has expired.
// s.mu must be held.
func (s *Store) lookup(key idemstore.Key, now time.Time) (entry, bool) {
	e, ok := s.records[key]
	if !ok {
		return entry{}, false
	}
	if e.expired(now) {
		delete(s.records, key)
		return entry{}, false
	}
	return e, true
}

// owned returns the live entry under key if it is pending and owned by
// token. s.mu must be held.
func (s *Store) owned(key idemstore.Key, token string, now time.Time) (entry, bool) {
	e, ok := s.lookup(key, now)
	if !ok || e.rec.State != idemstore.StatePending || e.rec.Token != token {
		return entry{}, false
	}
	return e, true
}

// store writes e under key, sweeping out expired records first when the map
// has doubled since the last sweep. s.mu must be held.
func (s *Store) store(key idemstore.Key, e entry, now time.Time) {
	if len(s.records) >= s.sweepAt {
		s.sweep(now)
		s.sweepAt = max(2*len(s.records), minSweep)
	}
	s.records[key] = e
}

// sweep deletes every expired record. s.mu must be held.
func (s *Store) sweep(now time.Time) {
	for k, e := range s.records {
		if e.expired(now) {
			delete(s.records, k)
		}
	}
}

func (e entry) expired(now time.Time) bool {
	return !e.expires.IsZero() && !now.Before(e.expires)
}

// out returns the record as a caller sees it: with its remaining TTL and a
// copy of its result.
func (e entry) out(now time.Time) idemstore.Record {
	rec := e.rec
	rec.Result = bytes.Clone(e.rec.Result)
	if !e.expires.IsZero() {
		rec.TTL = e.expires.Sub(now)
	}
	return rec
}

func checkTTL(method string, key idemstore.Key, ttl time.Duration) error {
	if ttl <= 0 {
		return fmt.Errorf("memstore: %s %s: time to live %v is not positive", method, key, ttl)
	}
	return nil
}
