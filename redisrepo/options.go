package redisrepo

import (
	"fmt"

	"github.com/idemkit/idempotency/coordinator"
)

// DefaultKeyPrefix is the prefix of every Redis key the Store writes unless
// WithKeyPrefix says otherwise.
const DefaultKeyPrefix = "idempotency:"

// An Option configures a Store; pass them to New. A nil Option is skipped.
// New cannot return an error, so it panics on an invalid option value, with
// an error that names the option, the value and what is accepted (a
// *coordinator.OptionError).
type Option interface{ apply(*Store) }

type optionFunc func(*Store)

func (f optionFunc) apply(s *Store) { f(s) }

// WithKeyPrefix sets the prefix of the Redis keys: a record lives under
// prefix + operation + ":" + key. Default DefaultKeyPrefix ("idempotency:").
// An empty prefix is allowed. A prefix with a Redis Cluster hash tag, such as
// "{idempotency}:", puts every record in one hash slot, and so on one node;
// see the package documentation.
func WithKeyPrefix(prefix string) Option {
	return optionFunc(func(s *Store) { s.prefix = prefix })
}

// RecordFormat is the format version of the records a Store writes. A Store
// reads both, whichever it writes.
type RecordFormat int

// The record formats (docs/architecture.md, "The record").
const (
	// Format1 is the HASH that releases before format 2 wrote and read.
	// Write it while instances of such a release still serve the same keys
	// (a rolling upgrade): they read it, where they would take a format 2
	// record for something unreadable and run its action again. Its
	// reservations and replays each run a Lua script, and its completions
	// wake no waiter in another process (they poll).
	Format1 RecordFormat = 1
	// Format2 is one STRING, read and written by plain commands: the
	// default.
	Format2 RecordFormat = 2
)

// WithRecordFormat sets the format of the records the Store writes: Format2
// (the default) or Format1, for the length of a rolling upgrade from a
// release before format 2 (see Format1). New panics on any other value, a
// programming error; idempotency.Settings checks IDEMPOTENCY_RECORD_FORMAT
// before it gets here.
func WithRecordFormat(f RecordFormat) Option {
	return optionFunc(func(s *Store) { s.format = f })
}

// validate checks the options New applied to s.
func (s *Store) validate() error {
	if s.format != Format1 && s.format != Format2 {
		return fmt.Errorf("redisrepo: invalid options: %w", &coordinator.OptionError{
			Option: "WithRecordFormat",
			Err:    fmt.Errorf("must be Format1 (1) or Format2 (2), got %d", int(s.format)),
		})
	}
	return s.validateAcks()
}
