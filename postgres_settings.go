package idempotency

import (
	"errors"
	"fmt"
	"net/url"
	"regexp"
	"strings"
)

// postgresErrors returns what is wrong with the POSTGRES_* variables, each
// error naming its variable and never any part of the password. Whether
// the database answers is idempg.Module's start-up check.
func (s Settings) postgresErrors() []error {
	var errs []error
	bad := func(name string, err error) {
		errs = append(errs, fmt.Errorf("%s_%s: %w", EnvPrefix, name, err))
	}
	if err := validatePostgresURL(s.PostgresURL); err != nil {
		bad("POSTGRES_URL", err)
	}
	if s.PostgresMaxConns < 0 {
		bad("POSTGRES_MAX_CONNS", fmt.Errorf("must be 0 (pgxpool's default) or more, got %d", s.PostgresMaxConns))
	}
	switch {
	case s.PostgresMinConns < 0:
		bad("POSTGRES_MIN_CONNS", fmt.Errorf("must be 0 or more, got %d", s.PostgresMinConns))
	case s.PostgresMaxConns > 0 && s.PostgresMinConns > s.PostgresMaxConns:
		bad("POSTGRES_MIN_CONNS", fmt.Errorf("must not be more than IDEMPOTENCY_POSTGRES_MAX_CONNS (%d), got %d", s.PostgresMaxConns, s.PostgresMinConns))
	}
	return errs
}

// isPostgresURL reports whether raw is in the URL form of a connection
// string rather than the key=value form.
func isPostgresURL(raw string) bool {
	return strings.HasPrefix(raw, "postgres://") || strings.HasPrefix(raw, "postgresql://")
}

// validatePostgresURL checks the form of a PostgreSQL connection string, as
// far as it can be checked without a driver: a postgres:// or postgresql://
// URL that parses, or key=value pairs. Empty is valid: no PostgreSQL store.
func validatePostgresURL(raw string) error {
	switch {
	case raw == "":
		return nil
	case isPostgresURL(raw):
		if _, err := url.Parse(raw); err != nil {
			return errors.New("the URL does not parse (a special character in the password must be percent-encoded)")
		}
		return nil
	case strings.Contains(raw, "://"):
		return errors.New("must be a postgres:// or postgresql:// URL, or a key=value connection string such as \"host=db dbname=shop\"")
	}
	for _, field := range dsnFields(raw) {
		if !strings.Contains(field, "=") {
			return fmt.Errorf("must be a postgres:// URL or key=value pairs, and %q has no =", field)
		}
	}
	return nil
}

// dsnFields splits a key=value connection string into its pairs, keeping a
// quoted value ('a b') in one, with any password value masked.
func dsnFields(raw string) []string {
	var fields []string
	for _, f := range dsnField.FindAllString(redactPostgres(raw), -1) {
		fields = append(fields, strings.TrimSpace(f))
	}
	return fields
}

var (
	// dsnField is one pair of a key=value connection string.
	dsnField = regexp.MustCompile(`[^\s=]+\s*(=\s*('([^'\\]|\\.)*'|\S*))?`)
	// dsnPassword is the password pair of a key=value connection string.
	dsnPassword = regexp.MustCompile(`(password\s*=\s*)('([^'\\]|\\.)*'|\S*)`)
)

// redactPostgres returns raw with its password replaced by "xxxxx": the
// URL's user information and a password query parameter, or the password
// pair of a key=value string. A URL that does not parse becomes "(invalid
// URL)".
func redactPostgres(raw string) string {
	if raw == "" {
		return ""
	}
	if !isPostgresURL(raw) {
		return dsnPassword.ReplaceAllString(raw, "${1}xxxxx")
	}
	u, err := url.Parse(raw)
	if err != nil {
		return "(invalid URL)"
	}
	if q := u.Query(); q.Has("password") {
		q.Set("password", "xxxxx")
		u.RawQuery = q.Encode()
	}
	return u.Redacted()
}
