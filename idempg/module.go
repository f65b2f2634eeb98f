package idempg

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/fx"
	"go.uber.org/zap"

	"github.com/idemkit/idempotency"
)

// Module makes idempotency.Module's coordinator use the PostgreSQL store:
//
//	fx.New(idempotency.Module, idempg.Module, ...)
//
// It opens a pool on IDEMPOTENCY_POSTGRES_URL, sized by
// IDEMPOTENCY_POSTGRES_MAX_CONNS and IDEMPOTENCY_POSTGRES_MIN_CONNS, unless
// the app hands it its own pool (UsePool), and closes the pool it opened on
// stop. It provides the *Store, and the coordinator that
// idempotency.Module provides is over it: inject *coordinator.Coordinator
// and call Do with it for a transactional call; the HTTP middleware and the
// other adapters work over it unchanged, with the same metrics, logs and
// spans.
//
// On start it checks the database. A misconfiguration stops the app with
// an error that names the variable and never the password: a password or
// user that the database refuses, a database that does not exist, a
// permission the store needs that the user lacks, a TLS setting the server
// cannot meet, pgx's statement cache behind a connection pooler such as
// PgBouncer (IDEMPOTENCY_POSTGRES_URL; docs/stores.md); the idempg tables missing, or at
// another schema version (IDEMPOTENCY_POSTGRES_MIGRATE: true applies the
// schema with Migrate, false checks it with CheckSchema). An unreachable
// database is an outage, not a misconfiguration: it is logged as a warning
// and the app starts, and calls fail with coordinator.ErrStorage until the
// database is back (with the schema checked on no call: run the check again
// by restarting once it is).
//
// The start-up check takes at most 5s (a pgx message quotes the host, the
// user and the database, never the password). It also runs a sweeper (Store.StartSweeper) that deletes expired records
// every minute, in batches of 1,000, logging a failure as a warning.
var Module = fx.Module("idempotency.postgres",
	fx.Provide(
		fx.Annotate(provideBackend, fx.ResultTags(`name:"`+idempotency.BackendName+`"`, ``)),
		fx.Annotate(provideOwnPool, fx.ResultTags(`name:"`+PoolName+`"`)),
	),
	fx.Provide(fx.Private, providePool, provideSettings),
)

// settingsBaseName and settingsGroup are the fx name of the Settings that
// SupplySettings hands Module, and the value group of OverrideSettings.
const (
	settingsBaseName = "idempotency.postgres.settings.base"
	settingsGroup    = "idempotency.postgres.settings"
)

// SupplySettings makes Module start from s instead of the environment, as
// fxtest.IgnoreEnvironment does for idempotency.Module.
func SupplySettings(s Settings) fx.Option {
	return fx.Supply(fx.Annotate(&s, fx.ResultTags(`name:"`+settingsBaseName+`"`)))
}

// OverrideSettings changes Module's settings after they are loaded, as
// idempotency.OverrideSettings does the core's:
//
//	idempg.OverrideSettings(func(s *idempg.Settings) { s.Migrate = true })
//
// The changed settings are validated again.
func OverrideSettings(change func(*Settings)) fx.Option {
	return fx.Supply(fx.Annotate(change, fx.ResultTags(`group:"`+settingsGroup+`"`)))
}

type settingsParams struct {
	fx.In

	Base      *Settings         `name:"idempotency.postgres.settings.base" optional:"true"`
	Overrides []func(*Settings) `group:"idempotency.postgres.settings"`
}

// provideSettings is Module's Settings: SupplySettings's, else the
// environment's (LoadSettings), with OverrideSettings's changes.
func provideSettings(p settingsParams) (Settings, error) {
	var s Settings
	if p.Base != nil {
		s = *p.Base
	} else {
		var err error
		if s, err = LoadSettings(); err != nil {
			return Settings{}, err
		}
	}
	if len(p.Overrides) == 0 {
		return s, nil
	}
	for _, o := range p.Overrides {
		if o != nil {
			o(&s)
		}
	}
	return s, s.Validate()
}

// PoolName is the fx name of the *pgxpool.Pool that Module opens on
// IDEMPOTENCY_POSTGRES_URL, for the app's own queries; an app that hands
// Module its pool (UsePool) has none under this name.
const PoolName = "idempotency.postgres"

// appPoolName is the fx name of the pool an app hands Module (UsePool).
const appPoolName = "idempotency.postgres.app"

// The sweeper that Module runs.
const (
	sweepInterval = time.Minute
	sweepBatch    = 1000
	// startupTimeout bounds the start-up check, so that an unreachable
	// database is an outage logged well within fx's start timeout.
	startupTimeout = 5 * time.Second
)

// UsePool makes Module use a pool the app already has in its graph, of type
// P (*pgxpool.Pool, or any DB), instead of opening one on
// IDEMPOTENCY_POSTGRES_URL. This is the usual setup when the actions write
// to the app's database: the idempg tables live in it, and Do's transaction
// is one of the app's. The app owns the pool: Module neither opens nor
// closes it, and the POSTGRES_URL and POSTGRES_*_CONNS variables do not
// apply.
//
//	fx.New(idempotency.Module, idempg.Module, idempg.UsePool[*pgxpool.Pool](), ...)
func UsePool[P DB]() fx.Option {
	return fx.Provide(fx.Annotate(
		func(p P) DB { return p },
		fx.ResultTags(`name:"`+appPoolName+`"`),
	))
}

// pool is the store's database, and where it comes from.
type pool struct {
	db   DB
	own  *pgxpool.Pool // opened by Module, closed on stop; nil with UsePool
	name string        // the variable or option to blame for a refusal
}

type poolParams struct {
	fx.In

	Settings Settings
	App      DB `name:"idempotency.postgres.app" optional:"true"`
}

func providePool(p poolParams) (*pool, error) {
	if p.App != nil {
		return &pool{db: p.App, name: "the app's pool (idempg.UsePool)"}, nil
	}
	own, err := NewPool(p.Settings)
	if err != nil {
		return nil, err
	}
	return &pool{db: own, own: own, name: urlVar}, nil
}

// NewPool returns the pool that Module opens on s.URL, sized by s.MaxConns
// and s.MinConns; it does no I/O. Its errors name
// the variable at fault and never show the password. idemctl opens its pool
// with it too.
func NewPool(s Settings) (*pgxpool.Pool, error) {
	if s.URL == "" {
		return nil, fmt.Errorf("%s: must be set with idempg.Module: the PostgreSQL database of the store, as a postgres:// URL or a key=value connection string (or hand the module the app's pool: idempg.UsePool)", urlVar)
	}
	if err := validatePostgresURL(s.URL); err != nil {
		return nil, fmt.Errorf("%s: %w", urlVar, err)
	}
	cfg, err := pgxpool.ParseConfig(s.URL)
	if err != nil {
		return nil, fmt.Errorf("%s: pgx cannot parse it: %s", urlVar, parseProblem(err, s.URL))
	}
	if s.MaxConns > 0 {
		cfg.MaxConns = s.MaxConns
	}
	if s.MinConns > 0 {
		cfg.MinConns = s.MinConns
	}
	if cfg.MinConns > cfg.MaxConns {
		return nil, fmt.Errorf("%s: %d is more than the pool's largest size, %d", minConnsVar, cfg.MinConns, cfg.MaxConns)
	}
	// NewWithConfig does no I/O: the first connection is made on use.
	own, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		return nil, fmt.Errorf("%s: %s", urlVar, parseProblem(err, s.URL))
	}
	return own, nil
}

// parseProblem is what pgx says is wrong with the connection string raw,
// without the string itself or any part of its secrets (pgx masks the
// password only as well as it can tell where the password is).
func parseProblem(err error, raw string) string {
	var pe *pgconn.ParseConfigError
	if errors.As(err, &pe) {
		if inner := pe.Unwrap(); inner != nil && !strings.Contains(inner.Error(), pe.ConnString) && !mentionsSecret(inner.Error(), raw) {
			return inner.Error()
		}
		return "check its form and parameters"
	}
	if mentionsSecret(err.Error(), raw) {
		return "check its form and parameters"
	}
	return err.Error()
}

// provideOwnPool is the pool Module opened, for the app.
func provideOwnPool(p *pool) (*pgxpool.Pool, error) {
	if p.own == nil {
		return nil, errors.New("idempg: the store uses the app's pool (idempg.UsePool): there is no pool of the module's (" + PoolName + ")")
	}
	return p.own, nil
}

type backendParams struct {
	fx.In

	Settings Settings
	Pool     *pool
}

func provideBackend(p backendParams) (*idempotency.Backend, *Store, error) {
	store, err := New(p.Pool.db)
	if err != nil {
		return nil, nil, err
	}
	var sweeper *Sweeper
	b := &idempotency.Backend{
		Store: store,
		Start: func(ctx context.Context, logger *zap.Logger) error {
			if err := startupCheck(ctx, p.Pool, p.Settings.Migrate, logger); err != nil {
				p.Pool.close()
				return err
			}
			var err error
			sweeper, err = store.StartSweeper(sweepInterval, sweepBatch, func(err error) {
				logger.Warn("idempg: sweeping expired records failed; trying again in a minute", zap.Error(err))
			})
			return err
		},
		Stop: func(context.Context) error {
			if sweeper != nil {
				sweeper.Stop()
			}
			p.Pool.close()
			return nil
		},
	}
	return b, store, nil
}

func (p *pool) close() {
	if p.own != nil {
		p.own.Close()
	}
}

// startupCheck connects, and checks or applies the schema. It returns an
// error for a misconfiguration, naming what to change, and logs an outage.
func startupCheck(ctx context.Context, p *pool, migrate bool, logger *zap.Logger) error {
	check, what := CheckSchema, "checking"
	if migrate {
		check, what = Migrate, "migrating"
	}
	ctx, cancel := context.WithTimeout(ctx, startupTimeout)
	defer cancel()
	err := checkServer(ctx, p.db)
	if err == nil {
		err = check(ctx, p.db)
	}
	if err == nil {
		return nil
	}
	var refused serverRefusal
	if errors.As(err, &refused) {
		return fmt.Errorf("%s: %w", p.name, err)
	}
	if errors.Is(err, ErrSchema) {
		var newer newerSchemaError
		if migrate || errors.As(err, &newer) {
			return fmt.Errorf("%s_POSTGRES_MIGRATE: %w", idempotency.EnvPrefix, err)
		}
		return fmt.Errorf("%s_POSTGRES_MIGRATE: %w (set %[1]s_POSTGRES_MIGRATE=true to apply it on start, or apply idempg.Schema with your migration tool)", idempotency.EnvPrefix, err)
	}
	if problem := refusal(err); problem != "" {
		return fmt.Errorf("%s: %s", p.name, problem)
	}
	logger.Warn("idempg: the PostgreSQL store is unreachable at start-up; calls fail with a storage error until it answers, and the schema was not checked",
		zap.String("doing", what), zap.Error(err))
	return nil
}

// CheckPool checks what Module checks at start-up, without migrating: that
// db reaches PostgreSQL, that it can run the store's statements (no pgx
// statement cache behind a connection pooler), and that it holds the
// schema version this package expects (CheckSchema). An error that shows a
// misconfiguration (a refused password, a pooler, a schema mismatch) says
// what to change; any other is the database's or the network's.
func CheckPool(ctx context.Context, db DB) error {
	err := checkServer(ctx, db)
	if err == nil {
		err = CheckSchema(ctx, db)
	}
	if err == nil {
		return nil
	}
	if problem := refusal(err); problem != "" {
		return errors.New(problem)
	}
	return err
}

// serverRefusal is an error of checkServer's that names a misconfiguration:
// start-up refuses it, naming the connection string's variable.
type serverRefusal interface {
	error
	refusesServer()
}

// pooledError is checkServer's refusal of a pool that caches prepared
// statements behind a connection pooler.
type pooledError struct{ connPID, serverPID uint32 }

func (pooledError) refusesServer() {}

func (e pooledError) Error() string {
	return fmt.Sprintf("a connection pooler is between the store and PostgreSQL (the connection's backend pid is %d, the server's %d), "+
		"and pgx caches prepared statements on the connection (default_query_exec_mode cache_statement, pgx's default), "+
		"which a pooler in transaction mode, such as PgBouncer, runs on other server connections (SQLSTATE 42P05, 26000): "+
		"add default_query_exec_mode=exec to the connection string (or set ConnConfig.DefaultQueryExecMode to pgx.QueryExecModeExec on the app's pool); "+
		"docs/stores.md, \"Behind PgBouncer\"", e.connPID, e.serverPID)
}

// readOnly is the text of checkServer's refusal of a server that takes no
// writes, and of a call's error when one still reaches it (classify).
const readOnly = "the server takes no writes (transaction_read_only is on: a hot standby, a primary demoted by a failover, " +
	"or default_transaction_read_only set for the database or the role): point the connection string at the primary " +
	"(with several hosts, add target_session_attrs=read-write); docs/stores.md, \"A read-only server\""

// readOnlyError is checkServer's refusal of a server that takes no writes.
type readOnlyError struct{}

func (readOnlyError) refusesServer() {}

func (readOnlyError) Error() string { return readOnly }

// checkServer refuses a DB whose transactions are read-only (a standby, or
// default_transaction_read_only), where every reservation would fail; and
// a DB whose connections cache prepared statements (pgx's default) when a
// connection pooler sits between them and PostgreSQL: the backend pid that
// the connection was given at start-up (a pooler gives its own) is not the
// one the server reports. The probe uses the simple protocol, so that it
// runs through any pooler.
func checkServer(ctx context.Context, db DB) error {
	tx, err := db.BeginTx(ctx, pgx.TxOptions{})
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	var pid uint32
	var ro string
	if err := tx.QueryRow(ctx, "SELECT pg_backend_pid(), current_setting('transaction_read_only')", pgx.QueryExecModeSimpleProtocol).Scan(&pid, &ro); err != nil {
		return err
	}
	if ro == "on" {
		return readOnlyError{}
	}
	conn := tx.Conn()
	if conn == nil || conn.PgConn().PID() == pid || conn.Config().DefaultQueryExecMode != pgx.QueryExecModeCacheStatement {
		return nil
	}
	return pooledError{connPID: conn.PgConn().PID(), serverPID: pid}
}

// refusal says what misconfiguration err shows, or "" for an outage.
func refusal(err error) string {
	var pg *pgconn.PgError
	if errors.As(err, &pg) {
		switch pg.Code {
		case "28P01":
			return "the database refused the password (" + pg.Code + " invalid_password)"
		case "28000":
			return "the database refused the user or the connection (" + pg.Code + " invalid_authorization_specification: an unknown user, or no pg_hba.conf entry for it): " + pg.Message
		case "3D000":
			return "the database does not exist (" + pg.Code + " invalid_catalog_name): " + pg.Message
		case "42P05", "26000":
			return "a prepared statement ran on another server connection than the one it was prepared on (" + pg.Code + "): a connection pooler in transaction mode, such as PgBouncer, is between the store and PostgreSQL: add default_query_exec_mode=exec to the connection string (docs/stores.md, \"Behind PgBouncer\")"
		case "25006":
			return readOnly + " (" + pg.Code + " read_only_sql_transaction)"
		case "42501":
			return "the user lacks a permission the store needs on its tables (" + pg.Code + " insufficient_privilege): " + pg.Message
		}
		return ""
	}
	var tlsErr *tls.CertificateVerificationError
	if errors.As(err, &tlsErr) || strings.Contains(err.Error(), "server refused TLS connection") ||
		strings.Contains(err.Error(), "tls: ") {
		return "the TLS connection cannot be made (check sslmode and the certificates): " + err.Error()
	}
	return ""
}
