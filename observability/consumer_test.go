package observability_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/idemkit/idempotency/idemconsume"
	"github.com/idemkit/idempotency/observability"
)

var commands = []string{"xreadgroup", "xack"}

func newConsumerObserver(t *testing.T, opts ...observability.Option) (*observability.ConsumerObserver, *prometheus.Registry, *observer.ObservedLogs) {
	t.Helper()
	reg := prometheus.NewRegistry()
	core, logs := observer.New(zapcore.DebugLevel)
	o, err := observability.NewConsumerObserver("billing.credit", commands,
		append([]observability.Option{observability.WithRegisterer(reg), observability.WithLogger(zap.New(core))}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return o, reg, logs
}

// Every series is there at zero before the first delivery.
func TestConsumerSeriesStartAtZero(t *testing.T) {
	_, reg, _ := newConsumerObserver(t)
	for _, r := range idemconsume.Reasons() {
		if v := counter(t, reg, "idempotency_consumer_deliveries_total", "operation", "billing.credit", "decision", r.Action().String(), "reason", string(r)); v != 0 {
			t.Errorf("%s: %v", r, v)
		}
	}
	if n := seriesCount(t, reg, "idempotency_consumer_dead_letters_total"); n != 4 {
		t.Errorf("%d dead-letter series, want one per dead-letter reason (4)", n)
	}
	if n := seriesCount(t, reg, "idempotency_consumer_errors_total"); n != len(commands)+1 {
		t.Errorf("%d error series, want the commands and unknown", n)
	}
	_ = counter(t, reg, "idempotency_consumer_claims_total", "operation", "billing.credit")
}

func TestConsumerObserverCountsAndLogs(t *testing.T) {
	o, reg, logs := newConsumerObserver(t)
	ctx := t.Context()
	msg := idemconsume.Message{ID: "1-0", Deliveries: 3}
	o.OnDecision(ctx, msg, idemconsume.Decision{Action: idemconsume.Ack, Reason: idemconsume.ReasonProcessed, Key: "order-42"})
	o.OnDecision(ctx, msg, idemconsume.Decision{Action: idemconsume.DeadLetter, Reason: idemconsume.ReasonPermanent, Key: "order-42",
		Err: errors.New(`credit "order-42": no such account`)})
	o.OnError(ctx, &idemconsume.CommandError{Command: "xack", Err: errors.New("redisstream: XACK orders 1-0: connection reset")})
	o.OnError(ctx, &idemconsume.CommandError{Command: "xfrobnicate", Err: errors.New("odd")})
	o.OnError(ctx, errors.New("no command"))
	o.OnClaim(ctx, 2)

	for _, c := range []struct {
		name   string
		labels []string
		want   float64
	}{
		{"idempotency_consumer_deliveries_total", []string{"operation", "billing.credit", "decision", "ack", "reason", "processed"}, 1},
		{"idempotency_consumer_deliveries_total", []string{"operation", "billing.credit", "decision", "dead_letter", "reason", "permanent_error"}, 1},
		{"idempotency_consumer_dead_letters_total", []string{"operation", "billing.credit", "reason", "permanent_error"}, 1},
		{"idempotency_consumer_errors_total", []string{"operation", "billing.credit", "command", "xack"}, 1},
		{"idempotency_consumer_errors_total", []string{"operation", "billing.credit", "command", "unknown"}, 2},
		{"idempotency_consumer_claims_total", []string{"operation", "billing.credit"}, 2},
	} {
		if v := counter(t, reg, c.name, c.labels...); v != c.want {
			t.Errorf("%s{%s} = %v, want %v", c.name, strings.Join(c.labels, ","), v, c.want)
		}
	}
	dead := logs.FilterMessage("message dead-lettered").All()
	if len(dead) != 1 || dead[0].Level != zapcore.WarnLevel {
		t.Fatalf("dead-letter lines %v, want one at warn", dead)
	}
	f := dead[0].ContextMap()
	if f["message_id"] != "1-0" || f["reason"] != "permanent_error" || f["deliveries"] != int64(3) || f["key_hash"] == nil ||
		strings.Contains(f["error"].(string), "order-42") {
		t.Errorf("dead-letter fields %v: want ID, reason, deliveries, key hash, and the key hidden in the error", f)
	}
	if n := logs.FilterMessage("consumer command failed").FilterLevelExact(zapcore.ErrorLevel).Len(); n != 3 {
		t.Errorf("%d error lines, want 3", n)
	}
	if n := logs.FilterMessage("consumer command failed").FilterField(zap.String("command", "xack")).Len(); n != 1 {
		t.Errorf("%d lines with command xack, want 1", n)
	}
}

func TestNewConsumerObserverRefuses(t *testing.T) {
	if _, err := observability.NewConsumerObserver("bad op", commands); err == nil {
		t.Error("an invalid operation was accepted")
	}
	if _, err := observability.NewConsumerObserver("billing.credit", commands, observability.WithNamespace("1x")); err == nil {
		t.Error("an invalid namespace was accepted")
	}
	// Twice on one registry: the second counts into the first's series.
	reg := prometheus.NewRegistry()
	for range 2 {
		o, err := observability.NewConsumerObserver("billing.credit", commands, observability.WithRegisterer(reg))
		if err != nil {
			t.Fatal(err)
		}
		o.OnClaim(t.Context(), 1)
	}
	if v := counter(t, reg, "idempotency_consumer_claims_total", "operation", "billing.credit"); v != 2 {
		t.Errorf("claims = %v, want 2", v)
	}
	// Without a registerer it only logs.
	o, err := observability.NewConsumerObserver("billing.credit", commands)
	if err != nil {
		t.Fatal(err)
	}
	o.OnError(t.Context(), errors.New("x"))
	o.OnClaim(t.Context(), 1)
	o.OnDecision(t.Context(), idemconsume.Message{}, idemconsume.Decision{Action: idemconsume.DeadLetter, Reason: idemconsume.ReasonBadMessage})
}
