package idemstore

import (
	"context"
	"time"
)

// Transactor is an optional interface of a Store that claims a key inside a
// database transaction and hands that transaction to the action, so that
// the action's writes through it, its result and the record commit together
// or not at all (idempg.Store). Over a Transactor, every call of the
// coordinator (coordinator.Do, Execute, and so every adapter) takes this path instead
// of Reserve, Complete and Release:
//
//   - a read first (Get), outside any transaction, while most of the
//     coordinator's recent calls found a record: a replay is then one read
//     and takes no lock (otherwise the claim comes first and reads the
//     record itself, so that a first run costs no read);
//   - Claim, which waits for a transaction that holds the key for as long
//     as the in-flight mode and the wait bound allow (mode run is treated as
//     wait: the claim is what makes the call exactly once);
//   - the action, with the claim's transaction in its context (the store's
//     accessor, such as idempg.Tx, takes it out);
//   - Claim.Commit with the result, or Claim.Rollback when the action
//     fails or panics: its writes are undone and the key is free.
//
// There is no lease to renew: the transaction holds the key for as long as
// it lives, and a holder that dies frees it when the database ends its
// connection. The on-storage-error mode does not apply: a store failure
// before the action returns a *coordinator.StorageError and never runs the action, since
// writes through a transaction that could not begin cannot happen either;
// and a failed Commit returns a *coordinator.StorageError with the action's result,
// since its writes did not commit (or, for a lost answer, may not have).
type Transactor interface {
	Store

	// Claim is Reserve in a transaction that stays open. If the key is free
	// (absent, or expired), or w.Replace is set and the record is not
	// pending and has token w.ReplaceToken, it writes w (a pending record)
	// in a new transaction and returns that transaction as an open Claim.
	// Otherwise it ends the transaction and returns the committed record
	// under the key, and a nil Claim. It waits up to wait for another
	// transaction that holds the key (wait <= 0: it does not wait), and
	// returns an error matching coordinator.ErrInProgress when that transaction held it
	// throughout.
	Claim(ctx context.Context, key Key, w Write, wait time.Duration) (Claim, Record, error)

	// Begin begins a transaction with no record in it, for a call made while
	// the kill switch is off (coordinator.WithEnabled(false)): the action still gets a
	// transaction, and its writes commit when it returns.
	Begin(ctx context.Context) (Claim, error)
}

// Claim is an open transaction of a Transactor, which holds a key (from
// Transactor.Claim) or none (from Transactor.Begin). The coordinator ends
// it exactly once, with Commit or Rollback.
type Claim interface {
	// Context returns ctx with the transaction in it, for the action.
	Context(ctx context.Context) context.Context

	// Commit writes c as the key's record in the transaction, in place of
	// the pending record the claim wrote, and commits. An error means that
	// nothing committed or, when the answer to the commit was lost, that
	// its outcome is unknown.
	Commit(ctx context.Context, c Completion) error

	// Rollback rolls the transaction back: the action's writes and the
	// claim are undone, and the key is free. It reports what went wrong
	// doing so, for the logs.
	Rollback(ctx context.Context) error
}
