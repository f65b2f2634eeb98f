package main

import (
	"context"
	"fmt"
	"maps"
	"slices"

	"github.com/idemkit/idempotency/coordinator/idemstore"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/idempg"
	"github.com/idemkit/idempotency/redisrepo"
)

// recordStore is the store a command works on: Redis, or the PostgreSQL store
// (idempg) when the settings name one (IDEMPOTENCY_POSTGRES_URL). Each
// method bounds its round trips by the storage timeout.
type recordStore interface {
	// inspect describes keys, without the owner token and the result.
	inspect(ctx context.Context, keys []idemstore.Key) ([]lookupEntry, error)
	// get reads the record of key, as the coordinator reads it.
	get(ctx context.Context, key idemstore.Key) (idemstore.Record, error)
	// forget deletes the records of keys and returns how many there were.
	forget(ctx context.Context, keys []idemstore.Key) (int, error)
	// forgetOperation forgets every record of operation, a batch at a
	// time, calling batch after each with the keys handled and forgotten
	// so far, and returns how many it forgot, before an error too.
	forgetOperation(ctx context.Context, operation string, batch func(done, forgotten int)) (int, error)
	// count counts the records per operation and state, of operations or
	// of every operation.
	count(ctx context.Context, operations []string) ([]countEntry, error)
	// where says where the records are, for messages: `under prefix "p"
	// on host:port`, or `in idempotency_records on host:port/db`.
	where() string
	Close()
}

// connect loads the settings and opens the store they name, as the module
// would: the PostgreSQL store when IDEMPOTENCY_POSTGRES_URL (or
// -postgres-url) is set, else Redis (idempotency.NewRedisClient,
// NewStore). It checks that the store answers within the storage timeout,
// so that an unreachable one fails fast, and tells a Redis that refuses
// idemctl (a misconfiguration) from one it cannot reach (pingError). Close
// it.
func (a *app) connect(ctx context.Context, o *overrides) (recordStore, error) {
	s, err := o.settings()
	if err != nil {
		return nil, err
	}
	if s.pg.URL != "" {
		return connectPostgres(ctx, s)
	}
	client, err := a.client(s.Settings)
	if err != nil {
		return nil, err
	}
	pctx, cancel := context.WithTimeout(ctx, s.StorageTimeout)
	defer cancel()
	if err := client.Ping(pctx).Err(); err != nil {
		_ = client.Close()
		return nil, pingError(ctx, err, s.Settings)
	}
	return &redisRecords{s: s.Settings, client: client, store: idempotency.NewStore(s.Settings, client)}, nil
}

// redisRecords are the records of the Redis store.
type redisRecords struct {
	s      idempotency.Settings
	client redis.UniversalClient
	store  *redisrepo.Store
}

func (r *redisRecords) Close() { _ = r.client.Close() }

func (r *redisRecords) where() string {
	return fmt.Sprintf("under prefix %q on %s", r.s.KeyPrefix, r.s.RedisAddr())
}

func (r *redisRecords) inspect(ctx context.Context, keys []idemstore.Key) ([]lookupEntry, error) {
	ctx, cancel := context.WithTimeout(ctx, r.s.StorageTimeout)
	defer cancel()
	infos, err := r.store.Inspect(ctx, keys...)
	if err != nil {
		return nil, err
	}
	entries := make([]lookupEntry, len(infos))
	for i, in := range infos {
		entries[i] = entryOf(in.Key, in.State, in.TTL, in.CreatedAt, in.Fingerprint, in.ResultSize)
		entries[i].RedisKey = in.RedisKey
	}
	return entries, nil
}

func (r *redisRecords) get(ctx context.Context, key idemstore.Key) (idemstore.Record, error) {
	ctx, cancel := context.WithTimeout(ctx, r.s.StorageTimeout)
	defer cancel()
	return r.store.Get(ctx, key)
}

func (r *redisRecords) forget(ctx context.Context, keys []idemstore.Key) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, r.s.StorageTimeout)
	defer cancel()
	return r.store.Forget(ctx, keys...)
}

// forgetOperation finds the keys with SCAN (Store.ScanKeys) and forgets
// each batch that it finds.
func (r *redisRecords) forgetOperation(ctx context.Context, operation string, batch func(done, forgotten int)) (int, error) {
	scanned, forgotten := 0, 0
	err := r.store.ScanKeys(ctx, operation, func(keys []idemstore.Key) error {
		n, err := r.forget(ctx, keys)
		scanned += len(keys)
		forgotten += n
		batch(scanned, forgotten)
		return err
	})
	return forgotten, err
}

func (r *redisRecords) count(ctx context.Context, operations []string) ([]countEntry, error) {
	counts, err := r.store.Count(ctx, operations...)
	if err != nil {
		return nil, err
	}
	entries := []countEntry{}
	for _, op := range slices.Sorted(maps.Keys(counts)) {
		n := counts[op]
		entries = append(entries, countEntry{
			Operation: op, Total: n.Total(), Pending: n.Pending, Completed: n.Completed,
			NotReplayable: n.NotReplayable, Unreadable: n.Unreadable, Format1: n.Format1,
		})
	}
	return entries, nil
}

// pgRecords are the records of the PostgreSQL store, in the table
// idempotency_records.
type pgRecords struct {
	s     config
	pool  *pgxpool.Pool
	store *idempg.Store
}

// forgetBatch is how many rows forget -all deletes per transaction on
// PostgreSQL.
const forgetBatch = 1000

// connectPostgres opens the pool the module would open on the settings
// (idempg.NewPool) and checks, within the storage timeout, that the
// database answers and holds the schema this idemctl reads
// (idempg.CheckSchema).
func connectPostgres(ctx context.Context, s config) (*pgRecords, error) {
	pool, err := idempg.NewPool(s.pg)
	if err != nil {
		return nil, err
	}
	r := &pgRecords{s: s, pool: pool}
	cctx, cancel := context.WithTimeout(ctx, s.StorageTimeout)
	defer cancel()
	if err := idempg.CheckSchema(cctx, pool); err != nil {
		pool.Close()
		return nil, fmt.Errorf("postgresql at %s: %w", r.addr(), err)
	}
	if r.store, err = idempg.New(pool); err != nil {
		pool.Close()
		return nil, err
	}
	return r, nil
}

func (r *pgRecords) Close() { r.pool.Close() }

// addr is the database's host, port and name, from the connection
// string: never its user or password.
func (r *pgRecords) addr() string {
	c := r.pool.Config().ConnConfig
	return fmt.Sprintf("%s:%d/%s", c.Host, c.Port, c.Database)
}

func (r *pgRecords) where() string { return "in idempotency_records on " + r.addr() }

func (r *pgRecords) inspect(ctx context.Context, keys []idemstore.Key) ([]lookupEntry, error) {
	ctx, cancel := context.WithTimeout(ctx, r.s.StorageTimeout)
	defer cancel()
	infos, err := r.store.Inspect(ctx, keys...)
	if err != nil {
		return nil, err
	}
	entries := make([]lookupEntry, len(infos))
	for i, in := range infos {
		entries[i] = entryOf(in.Key, in.State, in.TTL, in.CreatedAt, in.Fingerprint, in.ResultSize)
		entries[i].Table = "idempotency_records"
		for _, st := range in.Steps {
			e := stepEntry{Name: st.Name, Kind: "phase", State: "done", Reason: st.Reason, CommittedAt: st.CommittedAt.UTC()}
			if st.Outside {
				e.Kind = "outside"
			}
			if st.Failed {
				e.State = "failed"
			}
			entries[i].Steps = append(entries[i].Steps, e)
		}
	}
	return entries, nil
}

func (r *pgRecords) get(ctx context.Context, key idemstore.Key) (idemstore.Record, error) {
	ctx, cancel := context.WithTimeout(ctx, r.s.StorageTimeout)
	defer cancel()
	return r.store.Get(ctx, key)
}

func (r *pgRecords) forget(ctx context.Context, keys []idemstore.Key) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, r.s.StorageTimeout)
	defer cancel()
	return r.store.Forget(ctx, keys...)
}

// forgetOperation deletes forgetBatch rows at a time, each batch in a
// transaction of its own within the storage timeout, until none is left.
func (r *pgRecords) forgetOperation(ctx context.Context, operation string, batch func(done, forgotten int)) (int, error) {
	done, forgotten := 0, 0
	for {
		bctx, cancel := context.WithTimeout(ctx, r.s.StorageTimeout)
		live, deleted, err := r.store.ForgetOperation(bctx, operation, forgetBatch)
		cancel()
		done += deleted
		forgotten += live
		batch(done, forgotten)
		if err != nil || deleted == 0 {
			return forgotten, err
		}
	}
}

// count is one statement, bounded by ctx only, as Redis's SCAN is: on a
// large table it may take longer than the storage timeout.
func (r *pgRecords) count(ctx context.Context, operations []string) ([]countEntry, error) {
	counts, err := r.store.Count(ctx, operations...)
	if err != nil {
		return nil, err
	}
	entries := []countEntry{}
	for _, op := range slices.Sorted(maps.Keys(counts)) {
		n := counts[op]
		entries = append(entries, countEntry{
			Operation: op, Total: n.Total(), Pending: n.Pending, Completed: n.Completed,
			NotReplayable: n.NotReplayable, Unreadable: n.Unreadable,
		})
	}
	return entries, nil
}
