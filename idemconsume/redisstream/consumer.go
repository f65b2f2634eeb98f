package redisstream

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idempotency/idemconsume"
)

// Client is the part of a go-redis client that a Consumer uses: the stream
// commands. *redis.Client, *redis.ClusterClient, *redis.Ring and every
// redis.UniversalClient satisfy it.
type Client interface {
	XGroupCreateMkStream(ctx context.Context, stream, group, start string) *redis.StatusCmd
	XReadGroup(ctx context.Context, a *redis.XReadGroupArgs) *redis.XStreamSliceCmd
	XClaim(ctx context.Context, a *redis.XClaimArgs) *redis.XMessageSliceCmd
	XPendingExt(ctx context.Context, a *redis.XPendingExtArgs) *redis.XPendingExtCmd
	XAck(ctx context.Context, stream, group string, ids ...string) *redis.IntCmd
	XAdd(ctx context.Context, a *redis.XAddArgs) *redis.StringCmd
}

var (
	_ Client = (*redis.Client)(nil)
	_ Client = (*redis.ClusterClient)(nil)
	_ Client = (*redis.Ring)(nil)
	_ Client = redis.UniversalClient(nil)
)

// The fields that a dead-lettered entry carries besides its own; an
// entry's own fields that start with "dead-letter-" (an entry dead-lettered
// before, and published again) are replaced by them.
const (
	// FieldDeadID is the dead-lettered entry's ID in its stream.
	FieldDeadID = "dead-letter-id"
	// FieldDeadStream is the stream the entry was dead-lettered from.
	FieldDeadStream = "dead-letter-stream"
	// FieldDeadGroup is the consumer group that dead-lettered it.
	FieldDeadGroup = "dead-letter-group"
	// FieldDeadReason is the decision's idemconsume.Reason.
	FieldDeadReason = "dead-letter-reason"
	// FieldDeadError is the decision's error message.
	FieldDeadError = "dead-letter-error"
	// FieldDeadDeliveries is how many times the entry was delivered.
	FieldDeadDeliveries = "dead-letter-deliveries"
)

// Consumer consumes a Redis stream in a consumer group and processes every
// entry through an idemconsume.Processor. Create one with New and call Run.
type Consumer struct {
	client Client
	proc   *idemconsume.Processor
	stream string
	group  string
	handle idemconsume.Handler
	cfg    config

	mu      sync.Mutex
	running *running // of Start, until Stop
}

// running is a Run that Start began: stop ends its reads, abort its
// handlers' context, and done is closed with err set once it has returned.
type running struct {
	stop, abort context.CancelFunc
	done        chan struct{}
	err         error
}

// New returns a Consumer of the group of stream that processes each entry
// with handle, through p. The entry's fields are the idemconsume.Message's
// Fields (their values as strings), its ID the Message's ID, and its
// delivery count (1 for a new entry; XPENDING's for an entry read again or
// claimed) the Message's Deliveries; with p's default key function, the key
// is the entry's "idempotency-key" field, else its ID.
//
// New returns an error, and no Consumer, when client, p or handle is nil,
// stream or group is empty, or an option's value is refused.
func New(client Client, p *idemconsume.Processor, stream, group string, handle idemconsume.Handler, opts ...Option) (*Consumer, error) {
	var errs []error
	if client == nil {
		errs = append(errs, errors.New("client is nil"))
	}
	if p == nil {
		errs = append(errs, errors.New("processor is nil"))
	}
	if handle == nil {
		errs = append(errs, errors.New("handler is nil"))
	}
	if stream == "" {
		errs = append(errs, errors.New("stream is empty"))
	}
	if group == "" {
		errs = append(errs, errors.New("group is empty"))
	}
	cfg := defaultConfig()
	for _, o := range opts {
		if o != nil {
			o.apply(&cfg)
		}
	}
	if err := cfg.validate(); err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("redisstream: %w", err)
	}
	if cfg.name == "" {
		cfg.name = defaultName()
	}
	if cfg.deadStream == "" {
		cfg.deadStream = stream + DeadLetterSuffix
	}
	return &Consumer{client: client, proc: p, stream: stream, group: group, handle: handle, cfg: cfg}, nil
}

// defaultName returns the host name and 8 random hex digits.
func defaultName() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "consumer"
	}
	var b [4]byte
	_, _ = rand.Read(b[:])
	return host + "-" + hex.EncodeToString(b[:])
}

// Name returns the consumer's name in the group (see WithConsumerName).
func (c *Consumer) Name() string { return c.cfg.name }

// DeadLetterStream returns the name of the stream that dead-lettered
// entries go to.
func (c *Consumer) DeadLetterStream() string { return c.cfg.deadStream }

// Run creates the group if it does not exist (XGROUP CREATE ... MKSTREAM,
// from WithStartID), then consumes until ctx ends, with WithWorkers workers.
// Each worker first processes the entries left pending under its own name,
// one at a time, then, in turn, claims entries that another consumer left
// pending for WithMinIdle (XPENDING ... IDLE every WithClaimInterval, then
// XCLAIM, one at a time) and reads new ones (XREADGROUP, WithBatchSize at a
// time, blocking for WithBlock).
//
// Per decision: Ack acknowledges the entry (XACK); Retry leaves it pending,
// to be claimed once it has been idle for WithMinIdle; DeadLetter adds it,
// with the FieldDead* fields, to the dead-letter stream (XADD), then
// acknowledges it. Decision.RetryAfter is not used: a Retry is claimed
// again once it has been idle for WithMinIdle. A read or a claim that
// fails is reported to WithOnError and retried after a back-off (100ms,
// doubling up to 5s); it never stops Run. When the stream or the group is
// gone (NOGROUP: a DEL of the stream, an XGROUP DESTROY, a Redis that lost
// its data) the group is created again from WithStartID: with the default
// "0" the group reads the stream from its start again, and the entries
// whose records have expired (idemconsume.WithTTL) run again.
//
// When ctx ends, the handlers running get its cancellation, the entries not
// reached stay pending, and Run returns nil once every worker has stopped:
// within WithBlock, plus the time the handlers take to return, plus
// WithAckTimeout. While Redis cannot be reached, creating the group is
// retried, reported to WithOnError, after the same back-off, so a consumer
// started during an outage consumes once it ends. Run returns an error, at
// once, only when Redis refuses to create the group with an error that
// retrying cannot cure: the key holds something other than a stream
// (WRONGTYPE), the user may not run the command (NOPERM, NOAUTH).
// Run may be called again once it has returned, but not twice at once:
// both would read under the same consumer names.
func (c *Consumer) Run(ctx context.Context) error { return c.run(ctx, ctx) }

// run is Run with two contexts: when ctx ends, the workers stop reading and
// take no further entry; handlers run on hctx, and see it end.
func (c *Consumer) run(ctx, hctx context.Context) error {
	for backoff := time.Duration(0); ; {
		err := c.createGroup(ctx)
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			return nil
		}
		if !transient(err) {
			return err
		}
		c.reportError(ctx, err)
		backoff = min(max(2*backoff, minBackoff), maxBackoff)
		sleep(ctx, backoff)
	}
	var wg sync.WaitGroup
	for i := range c.cfg.workers {
		w := &worker{c: c, name: c.cfg.name, history: "0"}
		if c.cfg.workers > 1 {
			w.name = c.cfg.name + "-" + strconv.Itoa(i)
		}
		wg.Go(func() { w.run(ctx, hctx) })
	}
	wg.Wait()
	return nil
}

// createGroup creates the group, and the stream if need be; a group that
// exists is left as it is.
func (c *Consumer) createGroup(ctx context.Context) error {
	err := c.client.XGroupCreateMkStream(ctx, c.stream, c.group, c.cfg.startID).Err()
	if err != nil && !strings.HasPrefix(err.Error(), "BUSYGROUP") {
		return cmdErr(CommandGroupCreate, fmt.Errorf("redisstream: create group %q of stream %q: %w", c.group, c.stream, err))
	}
	return nil
}

// Start begins consuming in the background, for a lifecycle such as fx's
// (fx.StartStopHook(consumer.Start, consumer.Stop)), and returns once the
// group exists. It returns the error of creating the group when retrying
// cannot cure it (see Run), or ctx's error when ctx ends first; while Redis
// cannot be reached it returns nil and Run's retries take over. It returns
// an error when the Consumer was started and not stopped.
func (c *Consumer) Start(ctx context.Context) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.running != nil {
		return errors.New("redisstream: Start: the consumer is running; Stop it first")
	}
	if err := c.createGroup(ctx); err != nil && !transient(err) {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	// The consumer outlives Start's context, and keeps its values.
	base := context.WithoutCancel(ctx)
	rctx, stop := context.WithCancel(base)
	hctx, abort := context.WithCancel(base)
	r := &running{stop: stop, abort: abort, done: make(chan struct{})}
	go func() {
		defer close(r.done)
		r.err = c.run(rctx, hctx)
		if r.err != nil {
			c.reportError(rctx, r.err)
		}
	}()
	c.running = r
	return nil
}

// Stop stops what Start began: the workers read no further entries, the
// batches in hand finish (see WithBatchSize; a batch that a read blocked
// when Stop began returns is in hand too: Redis counted its delivery), and
// their entries are
// acknowledged (or dead-lettered, or left pending) as their decisions say.
// When ctx ends first, the handlers' context is canceled (the handlers
// running see it, the rest of their batches do not run, and those entries
// stay pending, to be claimed later) and Stop returns ctx's error without waiting longer;
// the workers then end within WithAckTimeout, and a second Stop waits for
// them (Start refuses until then). Stop returns the error that
// ended Run early, if any, and nil when the Consumer is not running.
func (c *Consumer) Stop(ctx context.Context) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	r := c.running
	if r == nil {
		return nil
	}
	r.stop()
	select {
	case <-r.done:
	case <-ctx.Done():
		r.abort()
		return fmt.Errorf("redisstream: stop consumer %q of stream %q: %w", c.cfg.name, c.stream, ctx.Err())
	}
	r.abort()
	c.running = nil
	return r.err
}

func (c *Consumer) reportError(ctx context.Context, err error) {
	for _, f := range c.cfg.onError {
		f(ctx, err)
	}
}

// The commands of the *idemconsume.CommandError values that a Consumer
// reports to WithOnError.
const (
	CommandGroupCreate = "xgroup_create"
	CommandReadGroup   = "xreadgroup"
	CommandClaim       = "xclaim"
	CommandPending     = "xpending"
	CommandAck         = "xack"
	CommandAdd         = "xadd"
)

// CommandAutoClaim was the command of a failed claim (XAUTOCLAIM).
//
// Deprecated: a Consumer finds idle entries with XPENDING (CommandPending)
// and claims them with XCLAIM (CommandClaim); it sends no XAUTOCLAIM.
const CommandAutoClaim = "xautoclaim"

// Commands returns the commands a Consumer reports errors of, for metric
// labels.
func Commands() []string {
	return []string{CommandGroupCreate, CommandReadGroup, CommandClaim, CommandPending, CommandAck, CommandAdd}
}

// cmdErr returns err as the *idemconsume.CommandError of command.
func cmdErr(command string, err error) error {
	return &idemconsume.CommandError{Command: command, Err: err}
}

// process processes a batch of deliveries together
// (idemconsume.Processor.ProcessBatch) and acts on the decisions: one XACK
// for the entries to acknowledge, then the dead letters.
func (c *Consumer) process(ctx context.Context, msgs []idemconsume.Message) {
	ds := make([]idemconsume.Decision, len(msgs))
	live := make([]idemconsume.Message, 0, len(msgs))
	at := make([]int, 0, len(msgs)) // at[j] is the index in msgs of live[j]
	for i, m := range msgs {
		if m.Fields == nil {
			// An entry deleted (XDEL, XTRIM) while it was pending is
			// delivered without fields: there is nothing to process.
			ds[i] = idemconsume.Decision{Action: idemconsume.Ack, Reason: idemconsume.ReasonDuplicate}
			continue
		}
		live = append(live, m)
		at = append(at, i)
	}
	for j, d := range c.proc.ProcessBatch(ctx, live, c.handle) {
		ds[at[j]] = d
	}
	// The effects, if any, have happened: acknowledge them even if the
	// consumer is stopping.
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.cfg.ackTimeout)
	defer cancel()
	var acks []string
	for i, d := range ds {
		if d.Action == idemconsume.Ack {
			acks = append(acks, msgs[i].ID)
		}
	}
	if len(acks) > 0 {
		if err := c.client.XAck(actx, c.stream, c.group, acks...).Err(); err != nil {
			c.reportError(ctx, cmdErr(CommandAck, fmt.Errorf("redisstream: XACK %s of %d entries (%s...): %w", c.stream, len(acks), acks[0], err)))
		}
	}
	for i, d := range ds {
		if d.Action == idemconsume.DeadLetter {
			c.deadLetter(actx, ctx, msgs[i], d)
		}
	}
	for i, d := range ds {
		for _, f := range c.cfg.onDecision {
			f(ctx, msgs[i], d)
		}
	}
}

// deadLetter adds msg to the dead-letter stream, then acknowledges it. An
// entry that cannot be added is not acknowledged: it is claimed again, and
// dead-lettered again. A crash between the two adds it twice.
func (c *Consumer) deadLetter(actx, ctx context.Context, msg idemconsume.Message, d idemconsume.Decision) {
	values := make([]any, 0, 2*len(msg.Fields)+12)
	for _, k := range slices.Sorted(maps.Keys(msg.Fields)) {
		if !strings.HasPrefix(k, "dead-letter-") {
			values = append(values, k, msg.Fields[k])
		}
	}
	errText := ""
	if d.Err != nil {
		errText = d.Err.Error()
	}
	values = append(values,
		FieldDeadID, msg.ID,
		FieldDeadStream, c.stream,
		FieldDeadGroup, c.group,
		FieldDeadReason, string(d.Reason),
		FieldDeadError, errText,
		FieldDeadDeliveries, strconv.FormatInt(msg.Deliveries, 10),
	)
	if err := c.client.XAdd(actx, &redis.XAddArgs{Stream: c.cfg.deadStream, Values: values}).Err(); err != nil {
		c.reportError(ctx, cmdErr(CommandAdd, fmt.Errorf("redisstream: XADD %s (dead letter of %s): %w", c.cfg.deadStream, msg.ID, err)))
		return
	}
	if err := c.client.XAck(actx, c.stream, c.group, msg.ID).Err(); err != nil {
		c.reportError(ctx, cmdErr(CommandAck, fmt.Errorf("redisstream: XACK %s %s: %w", c.stream, msg.ID, err)))
	}
}

// entries returns the entries of a read of one stream.
func entries(streams []redis.XStream) []redis.XMessage {
	if len(streams) == 0 {
		return nil
	}
	return streams[0].Messages
}

// message returns the idemconsume.Message of entry m, delivered n times.
// An entry without fields (deleted while pending) gets nil Fields.
func message(m redis.XMessage, n int64) idemconsume.Message {
	msg := idemconsume.Message{ID: m.ID, Deliveries: n}
	if len(m.Values) > 0 {
		msg.Fields = make(map[string]string, len(m.Values))
		for k, v := range m.Values {
			switch v := v.(type) {
			case string:
				msg.Fields[k] = v
			case nil:
				msg.Fields[k] = ""
			default:
				msg.Fields[k] = fmt.Sprint(v)
			}
		}
	}
	return msg
}

// transient reports whether err may go away if the command is sent again:
// anything but an error reply of Redis (a refused connection, a timeout),
// or a reply that says Redis is not ready yet or not here (LOADING,
// READONLY, MASTERDOWN, CLUSTERDOWN, TRYAGAIN, OOM, max clients).
func transient(err error) bool {
	var re redis.Error
	if !errors.As(err, &re) {
		return true
	}
	return redis.IsLoadingError(err) || redis.IsReadOnlyError(err) || redis.IsMasterDownError(err) ||
		redis.IsClusterDownError(err) || redis.IsTryAgainError(err) || redis.IsOOMError(err) || redis.IsMaxClientsError(err)
}

// isNoGroup reports whether err is Redis's NOGROUP: the stream or the
// group does not exist.
func isNoGroup(err error) bool {
	var re redis.Error
	return errors.As(err, &re) && strings.HasPrefix(re.Error(), "NOGROUP")
}

// sleep waits for d or until ctx ends.
func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}
