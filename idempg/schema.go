package idempg

import (
	"context"
	_ "embed" // Schema
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// Schema is the SQL that creates the tables of schema version SchemaVersion:
// idempotency_records (the records, with an index on expires_at for the
// sweeper), idempotency_steps (the recovery points of Steps, since version
// 2) and idempotency_schema (the versions applied). Every statement is
// idempotent. Migrate applies it; a service that runs its own migration tool
// can ship it as a migration instead.
//
//go:embed schema.sql
var Schema string

// SchemaVersion is the schema version this package reads and writes.
const SchemaVersion = 2

// ErrSchema matches the error of CheckSchema and Migrate when the database
// does not hold the schema this package expects: the tables are missing, or
// their version is another one.
var ErrSchema = errors.New("idempg: schema mismatch")

// migrateLock is the key of the transaction-level advisory lock that
// serialises Migrate across processes: concurrent CREATE TABLE IF NOT EXISTS
// of one table can fail on a unique index of the catalog.
const migrateLock = 0x69_64_65_6d_70_67 // "idempg"

// Migrate brings the database to schema version SchemaVersion, in one
// transaction under an advisory lock, so that processes starting at once
// may all call it. A database at SchemaVersion is left alone; one without the
// tables gets Schema. It returns an error matching ErrSchema when the
// database is at a newer version than this package knows, and the driver's
// error when a statement fails (for instance for want of the CREATE
// privilege).
func Migrate(ctx context.Context, db DB) error {
	tx, err := db.BeginTx(ctx, pgx.TxOptions{})
	if err != nil {
		return fmt.Errorf("idempg: migrate: %w", err)
	}
	// A no-op after Commit.
	defer func() {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
		_ = tx.Rollback(rctx)
		cancel()
	}()
	if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1)", int64(migrateLock)); err != nil {
		return fmt.Errorf("idempg: migrate: %w", err)
	}
	v, err := version(ctx, tx)
	if err != nil {
		return fmt.Errorf("idempg: migrate: %w", err)
	}
	switch {
	case v > SchemaVersion:
		return newerSchemaError(v)
	case v < SchemaVersion:
		// Every statement of Schema is idempotent, and version 2 only adds
		// a table and its index: Schema brings a database at version 0 or
		// 1 to 2. A later version that changes a table adds its own
		// statements here, applied in order from v+1.
		if _, err := tx.Exec(ctx, Schema); err != nil {
			return fmt.Errorf("idempg: migrate to schema version %d: %w", SchemaVersion, err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("idempg: migrate: %w", err)
	}
	return nil
}

// CheckSchema returns nil when the database holds schema version
// SchemaVersion, an error matching ErrSchema when its tables are missing or
// at another version, and the driver's error when it cannot ask. Call it at
// start-up when another tool applies the schema.
func CheckSchema(ctx context.Context, db DB) error {
	v, err := version(ctx, db)
	switch {
	case err != nil:
		return fmt.Errorf("idempg: check schema: %w", err)
	case v == 0:
		return fmt.Errorf("%w: no idempg tables (idempotency_schema) in the database's search path: run idempg.Migrate or apply idempg.Schema", ErrSchema)
	case v > SchemaVersion:
		return newerSchemaError(v)
	case v != SchemaVersion:
		return fmt.Errorf("%w: the database is at schema version %d, this idempg needs %d: run idempg.Migrate", ErrSchema, v, SchemaVersion)
	}
	return nil
}

// newerSchemaError is the ErrSchema of a database that a newer idempg
// migrated: only an upgrade of the library helps.
type newerSchemaError int

func (v newerSchemaError) Error() string {
	return fmt.Sprintf("%v: the database is at schema version %d, newer than this idempg's (%d): upgrade the library", ErrSchema, int(v), SchemaVersion)
}

func (newerSchemaError) Is(target error) bool { return target == ErrSchema }

// querier is what version needs: a DB or a transaction.
type querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// version returns the highest schema version applied, or 0 when the
// idempotency_schema table does not exist.
func version(ctx context.Context, q querier) (int, error) {
	var exists bool
	if err := q.QueryRow(ctx, "SELECT to_regclass('idempotency_schema') IS NOT NULL").Scan(&exists); err != nil || !exists {
		return 0, err
	}
	var v int
	err := q.QueryRow(ctx, "SELECT COALESCE(max(version), 0) FROM idempotency_schema").Scan(&v)
	return v, err
}
