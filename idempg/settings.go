package idempg

import (
	"fmt"
	"os"
	"strconv"

	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/internal/wholenum"
)

// The environment variables of Module's settings.
const (
	urlVar      = idempotency.EnvPrefix + "_POSTGRES_URL"
	maxConnsVar = idempotency.EnvPrefix + "_POSTGRES_MAX_CONNS"
	minConnsVar = idempotency.EnvPrefix + "_POSTGRES_MIN_CONNS"
	migrateVar  = idempotency.EnvPrefix + "_POSTGRES_MIGRATE"
)

// idempg declares its variables to the core's check for misspelt ones, so
// that a program that imports it accepts them (and one that does not,
// refuses them).
func init() {
	idempotency.DeclareVariables("idempg.Module (github.com/idemkit/idempotency/idempg)",
		urlVar, maxConnsVar, minConnsVar, migrateVar)
}

// Settings are Module's settings, from the IDEMPOTENCY_POSTGRES_*
// environment variables (LoadSettings; docs/configuration.md).
type Settings struct {
	// URL (IDEMPOTENCY_POSTGRES_URL, default empty) is the PostgreSQL
	// database of the store, as a postgres:// or postgresql:// URL or a
	// key=value connection string, with pgxpool's pool_* parameters if
	// wanted. The Redis variables do not apply then. Module requires it,
	// unless the app hands it its own pool (UsePool).
	URL string
	// MaxConns (IDEMPOTENCY_POSTGRES_MAX_CONNS, default 0: pgxpool's
	// default, the larger of 4 and the number of CPUs) is the largest
	// number of connections of the pool Module opens. A transactional call
	// holds one for as long as its action runs. 0 or more.
	MaxConns int32
	// MinConns (IDEMPOTENCY_POSTGRES_MIN_CONNS, default 0) is the number of
	// connections that pool keeps open when idle; at most MaxConns when
	// that is set.
	MinConns int32
	// Migrate (IDEMPOTENCY_POSTGRES_MIGRATE, default false) makes Module
	// apply the store's schema on start (Migrate, safe for processes that
	// start together); false only checks that the database holds the
	// expected schema version (CheckSchema), for a service whose migrations
	// run elsewhere.
	Migrate bool
}

// LoadSettings reads Settings from the IDEMPOTENCY_POSTGRES_* environment
// variables (an unset or empty one takes its default) and validates them.
// The error, an *idempotency.SettingsError, names every variable that is
// wrong, one per line, and never shows any part of a password.
func LoadSettings() (Settings, error) {
	var s Settings
	var errs []error
	s.URL = os.Getenv(urlVar)
	conns := func(name string) int32 {
		v := os.Getenv(name)
		if v == "" {
			return 0
		}
		if !wholenum.Decimal(v) {
			// The core's rule for every integer variable: 010 is refused,
			// not read as 10 here and as 8 by an octal reader.
			errs = append(errs, wholenum.Problem(name, v))
			return 0
		}
		n, err := strconv.ParseInt(v, 10, 32)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %q is out of range for a connection count", name, v))
		}
		return int32(n)
	}
	s.MaxConns, s.MinConns = conns(maxConnsVar), conns(minConnsVar)
	if v := os.Getenv(migrateVar); v != "" {
		var err error
		if s.Migrate, err = strconv.ParseBool(v); err != nil {
			errs = append(errs, fmt.Errorf("%s: %q is not true or false", migrateVar, v))
		}
	}
	if len(errs) == 0 {
		errs = s.problems()
	}
	if len(errs) > 0 {
		return Settings{}, &idempotency.SettingsError{Errs: errs}
	}
	return s, nil
}

// Validate reports every problem in s at once, one per line, each naming
// its variable and none showing a password; nil when s is usable. Whether
// the database answers is Module's start-up check.
func (s Settings) Validate() error {
	if errs := s.problems(); len(errs) > 0 {
		return &idempotency.SettingsError{Errs: errs}
	}
	return nil
}

func (s Settings) problems() []error {
	var errs []error
	if err := validatePostgresURL(s.URL); err != nil {
		errs = append(errs, fmt.Errorf("%s: %w", urlVar, err))
	}
	if s.MaxConns < 0 {
		errs = append(errs, fmt.Errorf("%s: must be 0 (pgxpool's default) or more, got %d", maxConnsVar, s.MaxConns))
	}
	switch {
	case s.MinConns < 0:
		errs = append(errs, fmt.Errorf("%s: must be 0 or more, got %d", minConnsVar, s.MinConns))
	case s.MaxConns > 0 && s.MinConns > s.MaxConns:
		errs = append(errs, fmt.Errorf("%s: must not be more than %s (%d), got %d", minConnsVar, maxConnsVar, s.MaxConns, s.MinConns))
	}
	return errs
}

// Redacted returns s with each secret of URL replaced by "xxxxx", where
// libpq reads one: the password (the URL's user information, a password
// parameter, or a key=value pair) and sslpassword. A connection string
// whose form libpq refuses becomes "(invalid connection string)".
func (s Settings) Redacted() Settings {
	s.URL = redactPostgres(s.URL)
	return s
}

// String returns s as Go syntax, redacted (Redacted).
func (s Settings) String() string {
	return fmt.Sprintf("%#v", s.Redacted())
}
