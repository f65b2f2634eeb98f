package observability

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/idemkit/idempotency/coordinator/idemstore"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/idemkit/idempotency/coordinator"
	"github.com/idemkit/idempotency/idemconsume"
	"github.com/idemkit/idempotency/internal/telemetry"
)

// The messages of a ConsumerObserver's log lines; docs/observability.md
// lists them with their levels and fields.
const (
	msgConsumerError = "consumer command failed"
	msgDeadLetter    = "message dead-lettered"
)

// ConsumerObserver turns what one queue consumer does into Prometheus metrics
// and zap log lines: every delivery's decision, its dead letters, its claims
// and its failed broker commands. Create one per consumer with
// NewConsumerObserver and hand its methods to the consumer's hooks
// (redisstream.WithOnDecision, WithOnError, WithOnClaim); it is safe for
// concurrent use.
type ConsumerObserver struct {
	log        *zap.Logger
	keys       LogKeysMode
	operation  string
	deliveries map[idemconsume.Reason]prometheus.Counter // nil without a registerer
	dead       map[idemconsume.Reason]prometheus.Counter
	claims     prometheus.Counter
	errors     map[string]prometheus.Counter // by command; unknownLabel for any other
}

// NewConsumerObserver returns the ConsumerObserver of a consumer whose
// processor runs under operation and whose adapter reports failed commands
// named in commands (redisstream.Commands()); another command is counted as
// "unknown". Of opts, WithRegisterer, WithNamespace, WithLogger and
// WithLogKeys apply, as for New; the series of operation are created at zero.
// It returns an error when operation or opts are invalid, or when a metric
// cannot be registered; registering on a registerer that holds them already
// (another consumer, another fx app) is not an error.
func NewConsumerObserver(operation string, commands []string, opts ...Option) (*ConsumerObserver, error) {
	c, err := newConfig(opts)
	if err != nil {
		return nil, err
	}
	if err := coordinator.ValidateOperation(operation); err != nil {
		return nil, fmt.Errorf("observability: consumer operation: %w", err)
	}
	o := &ConsumerObserver{log: c.logger.Named(subsystem), keys: c.logKeys, operation: operation}
	if c.registerer == nil {
		return o, nil
	}
	vec := func(name, help string, labels ...string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: c.namespace, Subsystem: subsystem, Name: name, Help: help},
			append([]string{"operation"}, labels...))
	}
	deliveries := vec("consumer_deliveries_total",
		"Deliveries a queue consumer processed, by decision (ack, retry, dead_letter) and reason (idemconsume.Reason).", "decision", "reason")
	dead := vec("consumer_dead_letters_total",
		"Messages a queue consumer decided to dead-letter, by reason.", "reason")
	claims := vec("consumer_claims_total",
		"Messages a queue consumer claimed from consumers that left them pending (XCLAIM).")
	errs := vec("consumer_errors_total",
		"Broker commands of a queue consumer that failed, by command (xreadgroup, xclaim, xack, ...).", "command")
	fq := func(name string) string { return prometheus.BuildFQName(c.namespace, subsystem, name) }
	var registered []prometheus.Collector
	for _, v := range []struct {
		vec  **prometheus.CounterVec
		name string
	}{
		{&deliveries, "consumer_deliveries_total"},
		{&dead, "consumer_dead_letters_total"},
		{&claims, "consumer_claims_total"},
		{&errs, "consumer_errors_total"},
	} {
		if *v.vec, err = register(c.registerer, *v.vec, fq(v.name), &registered); err != nil {
			for _, r := range registered {
				c.registerer.Unregister(r)
			}
			return nil, err
		}
	}
	o.deliveries = make(map[idemconsume.Reason]prometheus.Counter, len(idemconsume.Reasons()))
	o.dead = make(map[idemconsume.Reason]prometheus.Counter)
	for _, r := range idemconsume.Reasons() {
		o.deliveries[r] = deliveries.WithLabelValues(operation, r.Action().String(), string(r))
		if r.Action() == idemconsume.DeadLetter {
			o.dead[r] = dead.WithLabelValues(operation, string(r))
		}
	}
	o.claims = claims.WithLabelValues(operation)
	o.errors = make(map[string]prometheus.Counter, len(commands)+1)
	for _, cmd := range append(slices.Clone(commands), unknownLabel) {
		o.errors[cmd] = errs.WithLabelValues(operation, cmd)
	}
	return o, nil
}

// OnDecision counts d, and logs a dead letter at level Warn with the
// message's ID, deliveries, reason and error (the key as WithLogKeys says).
// Its signature is redisstream.WithOnDecision's.
func (o *ConsumerObserver) OnDecision(_ context.Context, msg idemconsume.Message, d idemconsume.Decision) {
	if o.deliveries != nil {
		if c, ok := o.deliveries[d.Reason]; ok && d.Reason.Action() == d.Action {
			c.Inc()
		}
		if c, ok := o.dead[d.Reason]; ok && d.Action == idemconsume.DeadLetter {
			c.Inc()
		}
	}
	if d.Action != idemconsume.DeadLetter {
		return
	}
	ce := o.log.Check(zap.WarnLevel, msgDeadLetter)
	if ce == nil {
		return
	}
	fields := []zap.Field{
		zap.String("operation", o.operation),
		zap.String("message_id", msg.ID),
		zap.String("reason", string(d.Reason)),
		zap.Int64("deliveries", msg.Deliveries),
	}
	k := idemstore.Key{Operation: o.operation, Key: d.Key}
	hidden := ""
	switch {
	case d.Key == "":
	case o.keys == LogKeysPlain:
		fields = append(fields, zap.String("key", d.Key))
	case o.keys == LogKeysOmitted:
		hidden = telemetry.OmittedKey
	default:
		h := telemetry.KeyHash(d.Key)
		fields = append(fields, zap.String("key_hash", h))
		hidden = "<key " + h + ">"
	}
	if d.Err != nil {
		if hidden == "" {
			fields = append(fields, zap.Error(d.Err))
		} else {
			fields = append(fields, zap.String("error", telemetry.Redact(d.Err.Error(), k, hidden)))
		}
	}
	ce.Write(fields...)
}

// OnError counts a failed broker command, by the Command of err's
// *idemconsume.CommandError ("unknown" without one, or for a command not
// given to NewConsumerObserver), and logs it at level Error. Its signature
// is redisstream.WithOnError's.
func (o *ConsumerObserver) OnError(_ context.Context, err error) {
	cmd := unknownLabel
	if ce := (*idemconsume.CommandError)(nil); errors.As(err, &ce) {
		cmd = ce.Command
	}
	if o.errors != nil {
		c, ok := o.errors[cmd]
		if !ok {
			cmd, c = unknownLabel, o.errors[unknownLabel]
		}
		c.Inc()
	}
	o.log.Error(msgConsumerError, zap.String("operation", o.operation), zap.String("command", cmd), zap.Error(err))
}

// OnClaim counts n claimed messages. Its signature is
// redisstream.WithOnClaim's.
func (o *ConsumerObserver) OnClaim(_ context.Context, n int) {
	if o.claims != nil && n > 0 {
		o.claims.Add(float64(n))
	}
}
