// Package idemstore is what a store author implements for the coordinator:
// the Store interface, the records it keeps, and the optional interfaces
// (Watcher, Fencer, BulkStore, Transactor) that a store may add. An
// application never needs it: it hands a store (redisrepo.Store,
// idempg.Store, memstore.Store) to coordinator.New. The conformance suite
// in coordinator/storetest checks a store against these contracts.
package idemstore

import (
	"context"
	"time"
)

// Key names one operation instance in a Store; the coordinator validates both
// fields first (coordinator.ValidateOperation, coordinator.ValidateKey), so a Store may use them
// verbatim.
type Key struct {
	Operation string
	Key       string
}

// String returns "operation:key", the form used in log lines and errors.
func (k Key) String() string { return k.Operation + ":" + k.Key }

// State is the state of a record as a Store reports it.
type State uint8

// The states of a record.
const (
	// StateAbsent means there is no record under the key (never written,
	// expired, released or forgotten).
	StateAbsent State = iota
	// StatePending means a caller holds a lease on the key and is running the
	// action. Record.Token is the holder's owner token.
	StatePending
	// StateCompleted means the action completed and Record.Result holds its
	// encoded result.
	StateCompleted
	// StateUnreadable means something is stored under the key that the Store
	// cannot parse (corrupt bytes, a wrong Redis type, a record format version
	// it does not know). The coordinator treats it as "not an outage": it runs
	// the action and replaces the record, so the key heals.
	StateUnreadable
	// StateNotReplayable means the action completed but its result could not
	// be kept (too large, not encodable, streamed): Record.Result holds the
	// reason as text, and every later call gets a *coordinator.NotReplayableError instead
	// of a second run.
	StateNotReplayable
)

// String returns "absent", "pending", "completed", "unreadable" or
// "not_replayable".
func (s State) String() string {
	switch s {
	case StateAbsent:
		return "absent"
	case StatePending:
		return "pending"
	case StateCompleted:
		return "completed"
	case StateUnreadable:
		return "unreadable"
	case StateNotReplayable:
		return "not_replayable"
	default:
		return "unknown"
	}
}

// Record is what a Store holds under a Key.
type Record struct {
	// State is the record's state. The zero value is StateAbsent.
	State State
	// Token is the owner token of the caller that reserved (StatePending) or
	// completed (StateCompleted) the record. A Store that cannot read the token
	// of an unreadable record reports "".
	Token string
	// Fingerprint is the request fingerprint stored with the record; "" when
	// the writer gave none.
	Fingerprint string
	// Result is the encoded result of a completed record, the reason of a
	// not-replayable one; nil otherwise.
	Result []byte
	// TTL is the remaining time to live the Store reports, or 0 when it does
	// not know. The coordinator never uses it to decide whether a record is
	// alive: expiry is the Store's business alone.
	TTL time.Duration
}

// Write is the record a Store writes with Reserve.
type Write struct {
	// State is StatePending for a reservation (a lease), or StateCompleted
	// or StateNotReplayable for a result written without a reservation
	// (in-flight mode "run", and the best-effort write after an unprotected
	// run).
	State State
	// Token is the writer's owner token: 64 random bits, hex encoded (16
	// lowercase hex digits), unique per call.
	Token string
	// Fingerprint is the request fingerprint; "" for none.
	Fingerprint string
	// Result is the encoded result when State is StateCompleted, the reason
	// when it is StateNotReplayable.
	Result []byte
	// TTL is the lease (StatePending) or the record's time to live
	// (StateCompleted). It is a positive whole number of milliseconds.
	TTL time.Duration
	// Replace, when true, also lets the write succeed over an existing record
	// that is not pending and whose Token equals ReplaceToken: the
	// compare-and-swap the coordinator uses to heal a record nobody can read,
	// so that of many concurrent healers only one runs the action.
	Replace bool
	// ReplaceToken is the token of the record to replace; see Replace. An
	// unreadable record with no readable token is replaced by ReplaceToken "".
	ReplaceToken string
}

// Completion is what Store.Complete writes over a pending record.
type Completion struct {
	// State is StateCompleted, or StateNotReplayable for a result that
	// could not be kept.
	State State
	// Result is the encoded result (StateCompleted) or the reason as text
	// (StateNotReplayable).
	Result []byte
	// TTL is the record's time to live, a positive whole number of
	// milliseconds.
	TTL time.Duration
}

// Store keeps idempotency records. It is the smallest interface the
// coordinator needs; each method is one atomic step, which a Redis
// implementation does in one round trip (one Lua script). Implementations
// must be safe for concurrent use, and must decide expiry with their own clock
// alone.
//
// The coordinator always passes a non-empty token, a positive whole number
// of milliseconds as a TTL, a Write whose State is pending, completed or not
// replayable, and a Completion whose State is completed or not replayable; a
// Store may return an error for anything else. A Store keeps each of these
// states as it was written and reports it back unchanged: a Store that
// reported a not-replayable record as absent would let the action run again. An empty completed result may
// come back as nil or as an empty slice.
//
// Errors: a Store returns an error only when it could not do the step (the
// network, a timeout, the server, a context that ended). The coordinator wraps any error that is
// not already a *coordinator.StorageError in one. "Absent" and "not the owner" are
// results, not errors.
//
// The package coordinator/storetest has a conformance suite that every Store
// should pass from its own tests.
type Store interface {
	// Reserve is reserve-or-read. If the key is absent (whatever w.Replace
	// says), or w.Replace is set and the existing record is not pending and
	// has token w.ReplaceToken (the token this Store reported for it), it
	// writes w with time to live w.TTL and returns (Record{}, true, nil).
	// Otherwise it leaves the key alone and returns the existing record and
	// false.
	Reserve(ctx context.Context, key Key, w Write) (existing Record, written bool, err error)

	// Get returns the record under key; a missing key is Record{State:
	// StateAbsent} and a nil error.
	Get(ctx context.Context, key Key) (Record, error)

	// Complete replaces the pending record under key owned by token with c
	// (state, result or reason, time to live), if and only if the key holds
	// that record; the stored record keeps the pending record's fingerprint
	// and token. It reports whether it did.
	Complete(ctx context.Context, key Key, token string, c Completion) (ok bool, err error)

	// Release deletes the key if and only if it holds a pending record owned
	// by token. It reports whether it did.
	Release(ctx context.Context, key Key, token string) (ok bool, err error)

	// Renew sets the time to live of the key to lease if and only if it holds
	// a pending record owned by token. It reports whether it did; false means
	// the lease is lost (the key expired, or another caller owns it now).
	Renew(ctx context.Context, key Key, token string, lease time.Duration) (ok bool, err error)
}

// Watcher is an optional interface of a Store whose records can be watched
// from any process: a caller that waits on a key held elsewhere learns
// within milliseconds, not at its next backed-off read, that the holder
// completed or released it. The coordinator uses it when its Store has it,
// and keeps polling beside it, backed off, in case a notice is lost.
type Watcher interface {
	// Watch reads the record under key as Get does. When the record is
	// pending it also returns a channel that receives a value when the
	// record may no longer be pending (its holder completed or released it,
	// or the notices may have been lost), and stop, which ends the watch and
	// which the coordinator calls once. The channel may be nil: the caller
	// then polls. Errors are as Get's.
	Watch(ctx context.Context, key Key) (rec Record, changed <-chan struct{}, stop func(), err error)
}

// Fencer is an optional interface of a Store that hands out fences: numbers
// that a downstream system can use to refuse the writes of a holder whose
// lease has passed to another caller (coordinator.WithFencedOperations).
type Fencer interface {
	// ReserveFenced is Reserve that gives every pending record it writes a
	// fence: a number greater than every fence ReserveFenced handed out
	// before for key, whatever happened to the records in between (expiry,
	// release, a takeover, a forget). It returns the fence of its write; when
	// it did not write because the key holds a pending record with token
	// w.Token (this caller's own, written by an attempt whose reply was
	// lost), that record's fence; otherwise 0. w.State is StatePending.
	ReserveFenced(ctx context.Context, key Key, w Write) (existing Record, fence uint64, written bool, err error)
}

// BulkStore is an optional interface of a Store that reads, reserves,
// completes and deletes the records of many keys at once: one round trip
// per node or hash slot on Redis, one statement on PostgreSQL, where the
// single-key methods take one per key. The slices a method takes are
// parallel (entry i of each is about keys[i]), and so are the slices it
// returns; a method returns an error, and changes nothing, when their
// lengths differ. Every entry obeys the rule of the single-key method it
// stands for, and the entries of one call are independent: a key given
// twice is two entries, decided in order.
//
// The entries are not one atomic step: on an error (a node that fails, a
// context that ends), some entries may have been applied and others not.
// ReserveMany may then return what it knows, entry by entry: written[i] for
// an entry it knows it wrote, or existing[i] (not absent) for one it knows
// it did not; an entry with neither is unknown. The coordinator goes on
// with the known entries and takes the error for the unknown ones, so that
// a batch across nodes of which one is down still runs the keys of the
// others. An entry's write carries its own token, so a caller that retries it with
// the same token meets its own record (Reserve's "our own reservation,
// met again"), and Complete and Release stay owner-checked.
type BulkStore interface {
	// GetMany is Get for each of keys: the record under keys[i] is
	// records[i], StateAbsent where there is none.
	GetMany(ctx context.Context, keys []Key) (records []Record, err error)

	// ReserveMany is Reserve for each i with keys[i] and ws[i]. With
	// allOrNothing set, when any entry did not write, it undoes the entries
	// that wrote and reports written[i] false for every i, with the records
	// that prevented the writes in existing (for a key given twice, that
	// may be the undone record of its earlier entry) and the zero Record
	// for the entries it undid: the seed's save_many with
	// rollback_on_error. A store with transactions rolls the writes back,
	// which also restores what a replacing write replaced; another deletes
	// each record it wrote while it still holds its write's token, whatever
	// its state (a write may be a completed record), so that another caller
	// may see a write before it is undone. With allOrNothing set and an
	// error, it also undoes, best effort, what it wrote.
	ReserveMany(ctx context.Context, keys []Key, ws []Write, allOrNothing bool) (existing []Record, written []bool, err error)

	// CompleteMany is Complete for each i with keys[i], tokens[i] and
	// cs[i]; ok[i] reports whether entry i completed.
	CompleteMany(ctx context.Context, keys []Key, tokens []string, cs []Completion) (ok []bool, err error)

	// DeleteMany deletes the records under keys, whoever owns them and
	// whatever their state, and returns how many it deleted: the operator's
	// forget. On an error, n counts the deletions that are known to have
	// been made.
	DeleteMany(ctx context.Context, keys []Key) (n int, err error)
}
