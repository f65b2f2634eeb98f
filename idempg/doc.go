// Package idempg keeps idempotency records in PostgreSQL, and runs an
// action exactly once per key when its effects are writes to that same
// database.
//
// It has two parts over one table, idempotency_records:
//
//   - [Store] is a [coordinator.Store]: a coordinator.Coordinator over it
//     behaves as over Redis, with records in PostgreSQL instead. The promise
//     is the coordinator's: at most one live holder per key, and an action
//     whose effect landed but whose completion never reached the database
//     runs again after its lease.
//   - [Do] (and [DoResult], [DoWithCodec]) is the transactional call, for
//     effects in the service's own PostgreSQL: it claims the key, runs the
//     action and writes its result in one transaction, so a crash at any
//     instant leaves both the action's writes and the record, or neither.
//
// # The transactional call
//
// Do takes the coordinator whose store is the idempg Store (with
// idempotency.Module and [Module] in an fx app, the coordinator it provides,
// configured from IDEMPOTENCY_* variables), and
// follows its settings: in-flight mode, wait timeout, TTLs, result limit and
// kill switch; its events go to the coordinator's observer, so its metrics,
// logs and spans are those of every other call:
//
//	store, err := idempg.New(pool)
//	c, err := coordinator.New(store, coordinator.WithObserver(obs))
//	...
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
// Do begins a READ COMMITTED transaction and inserts the key's pending
// record in it, uncommitted. A concurrent caller with the same key blocks on
// that row's lock (up to its wait bound; mode raise does not wait) until the
// holder's transaction ends: it then replays the result that committed, or,
// if the holder rolled back, claims the key and runs itself. The action gets
// the transaction, its writes through it and the completed record commit
// together, and a key that holds a completed record replays without running
// the action. Results are encoded as coordinator.Do encodes them (JSON, or a
// coordinator.Codec), so Do and a coordinator over the same Store replay
// each other's results.
//
// READ COMMITTED is deliberate, and holds whatever the database's default
// isolation: every statement of the Store also runs in a transaction at READ
// COMMITTED, a serialization failure or deadlock is retried within the
// context's deadline, and one that lasts matches coordinator.ErrConflict,
// which never runs an action unprotected. Behind a pooler in transaction
// mode (PgBouncer) use pgx's exec mode (default_query_exec_mode=exec in the
// connection string); [Module] refuses the statement cache there at
// start-up. Under it, an INSERT ... ON CONFLICT that has
// waited for another transaction sees the row that transaction committed,
// and the next statement sees it too; under REPEATABLE READ or SERIALIZABLE
// the waiter would fail with a serialization error instead (the committed
// row is newer than its snapshot), and every concurrent caller of a key would
// have to retry. An action that needs a stronger isolation for its own reads
// can take row locks (SELECT ... FOR UPDATE) in the transaction.
//
// # What is covered, and what is not
//
// Exactly once covers what the action writes through the pgx.Tx it is given,
// in the database of the Store's pool: those writes and the record commit or
// roll back as one. Anything else the action does is not covered: an HTTP
// call, a message published, a write through another connection or to
// another database happens when the action runs, and runs again when the
// transaction rolls back (an error, a crash, a failed COMMIT) and the call
// is retried. For such effects use the coordinator with the key passed
// downstream, or an outbox table written through tx.
//
// # When the database fails
//
// A coordinator's storage-error modes (run the action unprotected, or
// refuse) do not apply to Do: Do never runs the action without the
// database, since the action's writes could not happen either. A database
// failure before the action returns a *coordinator.StorageError
// (coordinator.ErrStorage) without running it. A failure after it (writing
// the record, COMMIT) rolls the transaction back, or, when the answer to
// COMMIT is lost, leaves its outcome unknown; Do returns a StorageError, and
// a retry with the same key is safe either way: it replays what committed,
// or runs the action once.
//
// # Mixing Do and a coordinator on one key
//
// A key that a coordinator has reserved holds a committed pending record: Do
// waits for it by polling (coordinator.WithPollInterval), bounded by the
// wait timeout (coordinator.WithWaitTimeout),
// and takes it over when its lease expires. A key that Do holds is an
// uncommitted row that the Store's methods cannot see: Get reports the key
// as it was, and Reserve waits on the row's lock for three quarters of the
// time left before its context's deadline, then reports a pending record
// with an empty token, so the coordinator waits (or raises) instead of
// running. Keep such transactions short: a coordinator polls a key that a
// long transaction holds with Reserves that each wait that long.
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
