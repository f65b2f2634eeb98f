// Package idempg keeps idempotency records in PostgreSQL, and runs an
// action exactly once per key when its effects are writes to that same
// database.
//
// [Store] keeps the records in one table, idempotency_records, and is a
// [idemstore.Transactor]: a coordinator over it claims each key inside a
// database transaction, runs the action with that transaction, and commits
// the action's writes through it with the completed record, or rolls both
// back. Every way of calling the coordinator takes this one path: [Do] and
// coordinator.Do, and the adapters over it (idemhttp, idemgin, idemecho,
// idemgrpc, idemconnect, the consumers), whose handlers run inside the
// claim's transaction and get it from their context with [Tx]:
//
//	func createOrder(w http.ResponseWriter, r *http.Request) {
//		tx, _ := idempg.Tx(r.Context()) // behind idemhttp.Middleware over the idempg store
//		var id int64
//		err := tx.QueryRow(r.Context(), `INSERT INTO orders (customer, total) VALUES ($1, $2) RETURNING id`,
//			customer, total).Scan(&id)
//		...
//	}
//
// The response (or the action's result) commits together with the
// handler's writes and the record: one record per request, under the
// adapter's scoped key. Set the adapter's scope hook (idemhttp.WithKeyScope,
// and its equivalents in the other adapters) on a multi-tenant API, so
// that one tenant's key never replays another's order: without one every
// caller shares one key space per operation. An outcome that is not
// stored (a 5xx, a status the store policy refuses, a gRPC or Connect code
// that is not stored), a panic or a failed COMMIT rolls the writes back
// and frees the key. A stored outcome commits with what the handler wrote
// before it: a 4xx, a stored code (FailedPrecondition, ...) or an Echo
// error answered with a 4xx. Refuse a request before writing.
// A handler that does not use the transaction is protected all the same.
//
// # The transactional call
//
// Do is coordinator.Do with the transaction as the action's argument:
//
//	charge, err := idempg.Do(ctx, c, coordinator.Call{
//		Operation:   "payment.charge",
//		Key:         key,
//		Fingerprint: fp,
//	}, func(ctx context.Context, tx pgx.Tx) (Charge, error) {
//		var c Charge
//		err := tx.QueryRow(ctx, `INSERT INTO charges (order_id, amount) VALUES ($1, $2)
//			RETURNING id, amount`, orderID, amount).Scan(&c.ID, &c.Amount)
//		return c, err
//	})
//
// c is the coordinator over the Store (with idempotency.Module and [Module]
// in an fx app, the coordinator it provides), and its settings and observer
// apply as to every call. A call begins a READ COMMITTED transaction and
// inserts the key's pending record in it, uncommitted, in one round trip
// that also reads the record already there: a completed key replays, and
// its transaction is rolled back. While most of the coordinator's recent
// calls are replays, a call reads the key's record first instead, outside
// any transaction, so that a replay is one round trip and takes no lock
// (see coordinator/idemstore.Transactor). A concurrent caller with the same key
// blocks on that row's lock (up to its wait bound; mode raise does not
// wait) until the holder's transaction ends: it then replays the result
// that committed, or, if the holder rolled back, claims the key and runs
// itself. In-flight mode run is treated as wait: the claim is what makes the
// call exactly once.
//
// READ COMMITTED is deliberate, and holds whatever the database's default
// isolation: every statement of the Store also runs in a transaction at READ
// COMMITTED, a serialization failure or deadlock is retried within the
// context's deadline, and one that lasts matches coordinator.ErrConflict,
// which never runs an action unprotected. Behind a pooler in transaction
// mode (PgBouncer) use pgx's exec mode (default_query_exec_mode=exec in the
// connection string); [Module] refuses the statement cache there at
// start-up. An action that needs a stronger isolation for its own reads can
// take row locks (SELECT ... FOR UPDATE) in the transaction.
//
// The action must not end the transaction: the transaction's Commit and
// Rollback refuse, a COMMIT, ROLLBACK, END or ABORT statement is refused
// before it is sent ([ErrTxEnded]), and a transaction that the action ended
// anyway (through tx.Conn()) is found when it returns: its key is kept as
// completed and not replayable, since some of its writes may have
// committed, so that it never runs twice. Once the call returns, the
// transaction and its savepoints refuse every use with pgx.ErrTxClosed:
// the call commits with the COMMIT in the same round trip as the record's
// completion, and the connection goes back to the pool.
//
// # Dead and frozen holders
//
// A holder's claim is an uncommitted row: when the database ends the
// holder's transaction, the key is free, and the next caller claims it at
// once; nobody waits out a lease. The claim sets, for its transaction only:
// idle_in_transaction_session_timeout to the coordinator's lease
// (IDEMPOTENCY_LEASE, 30s), client_connection_check_interval to 1s
// (PostgreSQL 14 and later), and TCP keepalives of 5s, 1s and 3 probes. So a
// holder whose process dies frees its key at once when it was between
// statements, and about a second later (the check interval) when it was
// inside one; a holder whose host or network vanished, when the keepalives
// give up (about 8s by their settings; not measured here); and a frozen
// holder (a paused pod, a SIGSTOP), one lease after its last statement
// ended. A holder that stays
// away from the database for longer than a lease while it holds the key
// therefore loses its transaction, and its call a *coordinator.StorageError:
// keep slow outside calls out of the transaction, or raise the lease.
//
// The same settings hold in the transaction of ReserveMany with
// allOrNothing, which keeps the keys it wrote until its COMMIT, a round trip
// after they are written: with the entries' lease in place of the
// coordinator's.
//
// The callers of one key in one process wait for it in the process, without
// a connection; one of them waits on the row's lock. So the waiters of a key
// that a hung transaction holds take one connection of the pool, not all of
// them.
//
// # What is covered, and what is not
//
// Exactly once covers what the action writes through the pgx.Tx it is given,
// in the database of the Store's pool: those writes and the record commit or
// roll back as one. Anything else the action does is not covered: an HTTP
// call, a message published, a write through another connection or to
// another database happens when the action runs, and runs again when the
// transaction rolls back (an error, a crash, a failed COMMIT) and the call
// is retried. For such effects pass the key downstream
// (coordinator.DownstreamKey), write an outbox row through tx, or split the
// request into recovery points (Steps).
//
// # Recovery points
//
// [Steps] is for a request that mixes writes here with outside calls (a
// checkout: reserve stock, charge a card, record the order), where one
// transaction would put the call between writes that can still roll back.
// Its body is a sequence of steps: each [Phase] is a transaction of its
// own that writes the step's row first, then its writes, and commits them
// with the step's result; each [Outside] call runs with the step's
// downstream key (coordinator.DownstreamKey), and its answer is kept with
// the next phase that commits, or with the record. A retry of a request that
// stopped reads the key's steps and resumes at the first one that did not
// commit: a committed phase is never run again, and an outside call is
// repeated only before its answer was kept, with the same key. A failure
// marked with idemconsume.Permanent is kept and replayed ([StepFailedError]). The
// body's value completes the record through the coordinator, last. Steps
// run outside the claim's transaction, one connection at a time; a
// concurrent run of the key waits on each step's row. The rows live in
// idempotency_steps (schema version 2), as long as the key's record, and
// [Store.Inspect] and idemctl lookup show them (docs/effects.md).
//
// # When the database fails
//
// The on-storage-error mode (run the action unprotected, or refuse) does not
// apply over the Store: a call never runs the action without the database,
// since the action's writes could not happen either. A failure before the
// action returns a *coordinator.StorageError (coordinator.ErrStorage)
// without running it. A failure after it (writing the record, COMMIT)
// rolls the transaction back, or, when the answer to COMMIT is lost, leaves
// its outcome unknown; the call returns a *coordinator.StorageError (the
// adapters answer 503, UNAVAILABLE, or a retry of the message), and a retry
// with the same key is safe either way: it replays what committed, or runs
// the action once. A pending record that a process of an earlier release
// committed (with Reserve) is waited for by polling, and taken over when
// its lease expires.
//
// # Expiry and the sweeper
//
// Leases and time to live are expires_at on the database's clock. A record
// whose expires_at has passed is absent for every reader; the request path
// only ever touches its key's row (an expired row is overwritten by the next
// writer of the key), and [Store.Sweep] deletes expired rows in batches
// through the index on expires_at. Run it from a job, or start
// [Store.StartSweeper] with the service and stop it on shutdown.
//
// # Schema and migrations
//
// [Schema] is the SQL of the tables (schema.sql in this package); [Migrate]
// applies it in a transaction under an advisory lock, so processes that
// start together may all call it; [CheckSchema] checks at start-up that the
// database is at [SchemaVersion] when another tool applies the schema. The
// version lives in the table idempotency_schema. A later version of this
// package that changes the schema raises SchemaVersion and ships the
// statements from each version to the next: Migrate applies them in order,
// in one transaction; services that run their own migration tool get them
// as files to copy. A process of an older version that starts after the
// migration fails CheckSchema (and Migrate) rather than misread the table.
package idempg
