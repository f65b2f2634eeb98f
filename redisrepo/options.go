package redisrepo

import (
	"context"
	"fmt"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idempotency/coordinator"
	"github.com/idemkit/idempotency/internal/coalesce"
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
	if s.lanes < 0 {
		return fmt.Errorf("redisrepo: invalid options: %w", &coordinator.OptionError{
			Option: "WithCoalescing",
			Err:    fmt.Errorf("must be 0 (off) or more lanes, got %d", s.lanes),
		})
	}
	return s.validateAcks()
}

// coalescer returns the Coalescer of s's callers' commands (see
// WithCoalescing), or nil when coalescing is off.
func (s *Store) coalescer() uncopiedProcessor {
	if s.lanes == 0 {
		return nil
	}
	switch c := s.client.(type) {
	case *redis.Client:
		return coalesce.New(c, s.lanes)
	case *redis.ClusterClient:
		return coalesce.NewCluster(c, s.lanes)
	}
	return nil
}

// uncopiedProcessor is a client that sends the store's own commands without
// copying them, where a Process that may return before its command has run
// (its context ended first) sends a copy, so that nothing writes the
// caller's command afterwards: the Coalescer, and the AutoPipeliner that
// idempotency.NewStoreClient gives the store. The copy costs two
// allocations per call; the store needs none of it, since it never reads a
// command whose call failed (see send).
//
// ProcessUncopied sends cmd as Process would, and returns its error. When
// that is ctx's error, cmd may still be sent and written later: its caller
// must not read it.
type uncopiedProcessor interface {
	ProcessUncopied(ctx context.Context, cmd redis.Cmder) error
}

// send sends cmd, a command of a caller's call: through the Coalescer when
// there is one and the call is on a request path, else to the client. It
// returns cmd's error; the caller reads cmd only when that is nil, since a
// command sent uncopied may still be written after a failed call.
func (s *Store) send(ctx context.Context, cmd redis.Cmder) error {
	if s.hot != nil && !coordinator.OffRequestPath(ctx) {
		return s.hot.ProcessUncopied(ctx, cmd)
	}
	if s.uncopied != nil {
		return s.uncopied.ProcessUncopied(ctx, cmd)
	}
	_ = s.client.Process(ctx, cmd)
	return cmd.Err()
}

// WithCoalescing sets how many commands of concurrent callers the Store has
// in flight at once before it groups them: a call that finds one of lanes
// lanes idle sends its command at once, alone, and the calls that come
// while every lane has a command in flight wait for one of them and go
// together in one pipeline (docs/performance.md, "Coalescing"). One caller
// pays no wait for it; many callers pay a few round trips where they paid
// one each. Lanes 0 turns it off: every command is sent on its own, as the
// client sends it. The default is DefaultLanes over a *redis.Client (a
// server, or Sentinel's failover client) or a *redis.ClusterClient, and off
// over any other client (a *redis.Ring, an AutoPipeliner, a wrapper), which
// WithCoalescing cannot turn on. New panics on a negative number.
//
// Only the calls of the coordinator's callers coalesce: renewals and the
// completions retried in the background (coordinator.OffRequestPath), bulk
// operations and administration go to the client directly.
func WithCoalescing(lanes int) Option {
	return optionFunc(func(s *Store) { s.lanes = lanes })
}

// DefaultLanes is the number of lanes of WithCoalescing's default.
const DefaultLanes = coalesce.DefaultLanes
