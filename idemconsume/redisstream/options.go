package redisstream

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/idemkit/idempotency/idemconsume"

	"github.com/idemkit/idempotency/coordinator"
)

// Defaults of the options.
const (
	// DefaultWorkers is how many messages a Consumer processes at once
	// (WithWorkers).
	DefaultWorkers = 1
	// DefaultBatchSize is how many entries a worker reads or claims at a
	// time (WithBatchSize).
	DefaultBatchSize = 10
	// DefaultBlock is how long a read waits for new entries (WithBlock).
	DefaultBlock = 2 * time.Second
	// DefaultMinIdle is how long an entry stays pending, unacknowledged,
	// before another consumer claims it (WithMinIdle): the coordinator's
	// default lease. Idle time counts from the entry's last delivery and a
	// reservation lasts a lease from its last renewal, so the reservation of
	// a consumer that crashed early in its handler has expired by the time
	// the entry is claimed; one that crashed later is found in progress, and
	// waited for or retried.
	DefaultMinIdle = 30 * time.Second
	// DefaultClaimInterval is how often a worker looks for entries to claim
	// (WithClaimInterval).
	DefaultClaimInterval = 5 * time.Second
	// DefaultAckTimeout bounds the acknowledgement, or dead-lettering, of a
	// processed entry (WithAckTimeout).
	DefaultAckTimeout = 5 * time.Second
	// DefaultStartID is where a group that New's consumer creates starts
	// reading (WithStartID): the beginning of the stream.
	DefaultStartID = "0"
	// DeadLetterSuffix makes the default dead-letter stream's name: the
	// stream's name followed by ":dead".
	DeadLetterSuffix = ":dead"
)

// An Option configures a Consumer; pass options to New. A nil Option is
// skipped; an invalid value makes New return an error, each refused option
// as a *coordinator.OptionError.
type Option interface{ apply(*config) }

type optionFunc func(*config)

func (f optionFunc) apply(c *config) { f(c) }

type config struct {
	name          string
	workers       int
	batch         int64
	block         time.Duration
	minIdle       time.Duration
	claimInterval time.Duration
	ackTimeout    time.Duration
	startID       string
	deadStream    string
	onDecision    []func(context.Context, idemconsume.Message, idemconsume.Decision)
	onError       []func(context.Context, error)
	onClaim       []func(context.Context, int)
}

func defaultConfig() config {
	return config{
		workers:       DefaultWorkers,
		batch:         DefaultBatchSize,
		block:         DefaultBlock,
		minIdle:       DefaultMinIdle,
		claimInterval: DefaultClaimInterval,
		ackTimeout:    DefaultAckTimeout,
		startID:       DefaultStartID,
	}
}

// WithConsumerName sets the consumer's name in the group; with more than
// one worker, worker i is the group's consumer "name-i". A consumer that
// starts under the name of one that stopped (a pod's stable name) first
// processes the entries left pending under that name, at once; any other
// consumer claims them only once they have been idle for WithMinIdle.
// Default: the host name and 8 random hex digits, new on every start.
func WithConsumerName(name string) Option { return optionFunc(func(c *config) { c.name = name }) }

// WithWorkers sets how many entries the Consumer processes at once: each
// worker is a consumer of the group that reads, claims and processes its
// own entries. Default DefaultWorkers (1); at least 1.
func WithWorkers(n int) Option { return optionFunc(func(c *config) { c.workers = n }) }

// WithBatchSize sets how many entries a worker reads or claims at a time
// (COUNT). The entries of a batch are processed together
// (idemconsume.Processor.ProcessBatch: their keys reserved or read in one
// round trip, their handlers run one after the other, their records
// completed together, one XACK); a batch begun when the consumer stops is
// finished, and the handlers that have not begun when the handlers'
// context ends do not run: their entries stay pending, and are claimed
// later. Default DefaultBatchSize (10); at least 1.
func WithBatchSize(n int) Option { return optionFunc(func(c *config) { c.batch = int64(n) }) }

// WithBlock sets how long a read (XREADGROUP BLOCK) waits for new entries.
// It also bounds how long Run takes to return once its context ends, as a
// blocked read is not interrupted. Default DefaultBlock (2s); at least 1ms.
func WithBlock(d time.Duration) Option { return optionFunc(func(c *config) { c.block = d }) }

// WithMinIdle sets how long an entry stays pending before a worker claims it
// (XPENDING ... IDLE, XCLAIM min-idle-time): the redelivery delay of an entry whose
// consumer died, failed its handler, or found it in progress. Keep it at
// least the coordinator's lease (IDEMPOTENCY_LEASE) and longer than a batch
// usually takes (WithBatchSize times a handler's run: idle time counts from
// the batch's read, and its entries run one after another): a claim of an
// entry whose batch still runs elsewhere finds it in progress, which costs
// a delivery. Default
// DefaultMinIdle (30s); at least 1ms.
func WithMinIdle(d time.Duration) Option { return optionFunc(func(c *config) { c.minIdle = d }) }

// WithClaimInterval sets how often each worker looks for entries idle for
// WithMinIdle (XPENDING ... IDLE), between reads, and claims them one at a
// time (XCLAIM). Default DefaultClaimInterval (5s); at least 1ms.
func WithClaimInterval(d time.Duration) Option {
	return optionFunc(func(c *config) { c.claimInterval = d })
}

// WithAckTimeout bounds the acknowledgement (XACK) or the dead-lettering
// (XADD, then XACK) of a processed entry. They run after the consumer's
// context has ended too: an effect that happened is acknowledged even while
// the consumer stops. Default DefaultAckTimeout (5s); positive.
func WithAckTimeout(d time.Duration) Option { return optionFunc(func(c *config) { c.ackTimeout = d }) }

// WithStartID sets the ID from which a group that Run creates reads: "0"
// for every entry in the stream, "$" for entries added from now on. A
// group that exists keeps its position; one that Run creates again after it
// was deleted (NOGROUP) starts from here too. Default DefaultStartID ("0").
func WithStartID(id string) Option { return optionFunc(func(c *config) { c.startID = id }) }

// WithDeadLetterStream names the stream that dead-lettered entries are
// added to. Default: the stream's name followed by DeadLetterSuffix
// (":dead"). On Redis Cluster it may live on another node: the entry is
// added first and acknowledged after, never the other way round.
func WithDeadLetterStream(name string) Option {
	return optionFunc(func(c *config) { c.deadStream = name })
}

// WithOnDecision adds a function called with every delivery's decision once
// the Consumer has acted on it (sent its XACK or dead letter, or left it
// pending): for logs and metrics (observability.ConsumerObserver.OnDecision).
// A command that failed is reported to WithOnError, not here: the entry
// stays pending, and its next delivery is decided and reported again.
// It runs on the worker's goroutine and delays the next entry while it runs.
// Each WithOnDecision adds one, called in order; a nil f adds none.
func WithOnDecision(f func(ctx context.Context, msg idemconsume.Message, d idemconsume.Decision)) Option {
	return optionFunc(func(c *config) {
		if f != nil {
			c.onDecision = append(c.onDecision, f)
		}
	})
}

// WithOnError adds a function called with each failed stream command
// (creating the group, reading, claiming, reading delivery counts,
// acknowledging, dead-lettering), an *idemconsume.CommandError whose Command
// is one of Commands: the Consumer retries after a back-off (group creation,
// reads, claims), processes the entry with an unknown delivery count
// (XPENDING), or leaves the entry pending to be claimed again (acks,
// dead-letters), and tells no one else. Each WithOnError adds one, called
// in order; a nil f adds none.
func WithOnError(f func(ctx context.Context, err error)) Option {
	return optionFunc(func(c *config) {
		if f != nil {
			c.onError = append(c.onError, f)
		}
	})
}

// WithOnClaim adds a function called with the number of entries that a
// worker claimed from other consumers, or from itself after a Retry
// (XCLAIM), before it processes them: n entries claimed together (see
// the package's "Redelivery and takeover"), or 1. Each WithOnClaim adds one, called
// in order; a nil f adds none.
func WithOnClaim(f func(ctx context.Context, n int)) Option {
	return optionFunc(func(c *config) {
		if f != nil {
			c.onClaim = append(c.onClaim, f)
		}
	})
}

func (c *config) validate() error {
	var errs []error
	refuse := func(option, format string, args ...any) {
		errs = append(errs, &coordinator.OptionError{Option: option, Err: fmt.Errorf(format, args...)})
	}
	if c.workers < 1 {
		refuse("WithWorkers", "must be at least 1, got %d", c.workers)
	}
	if c.batch < 1 {
		refuse("WithBatchSize", "must be at least 1, got %d", c.batch)
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"WithBlock", c.block}, {"WithMinIdle", c.minIdle}, {"WithClaimInterval", c.claimInterval}} {
		if d.v < time.Millisecond {
			refuse(d.name, "must be at least 1ms, got %v", d.v)
		}
	}
	if c.ackTimeout <= 0 {
		refuse("WithAckTimeout", "must be positive, got %v", c.ackTimeout)
	}
	if c.startID == "" {
		refuse("WithStartID", "must not be empty")
	}
	return errors.Join(errs...)
}
