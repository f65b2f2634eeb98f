package idempotency_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/fx"
	"go.uber.org/fx/fxtest"
	"go.uber.org/goleak"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/idemconsume"
	"github.com/idemkit/idempotency/idemconsume/redisstream"
	"github.com/idemkit/idempotency/internal/redistest"
)

// streamEnv points the module at the test's Redis, under the test's own
// prefix, and returns a client of it and the prefix.
func streamEnv(t *testing.T) (*redis.Client, string) {
	t.Helper()
	clearEnv(t)
	opts := redistest.ServerOptions(t)
	prefix := redistest.Prefix(t)
	t.Setenv("IDEMPOTENCY_REDIS_URL", "redis://"+opts.Addr+"/0")
	t.Setenv("IDEMPOTENCY_KEY_PREFIX", prefix+"idem:")
	return redistest.Server(t), prefix
}

// waitFor polls cond until it holds, failing the test after 10s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	eventually(t, func() error {
		if cond() {
			return nil
		}
		return errors.New("timed out waiting for " + what)
	})
}

// eventually polls check until it returns nil, failing the test after 10s
// with check's last error, so that the message says what was seen at the end.
func eventually(t *testing.T, check func() error) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := check()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after 10s: %v", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// pending returns how many entries of stream the group has not acknowledged.
func pending(t *testing.T, rdb *redis.Client, stream, group string) int64 {
	t.Helper()
	p, err := rdb.XPending(t.Context(), stream, group).Result()
	if err != nil {
		return -1
	}
	return p.Count
}

// An fx app runs a consumer with one option: it processes the stream on a
// real Redis, once per key, and stops cleanly, waiting for the message in
// hand.
func TestConsumeStreamRunsWithTheAppsLifecycle(t *testing.T) {
	rdb, prefix := streamEnv(t)
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent(), goredisProbe) // the shared server runs on
	stream := prefix + "orders"
	reg, regOpt := registry()

	var mu sync.Mutex
	var credited []string
	hold := make(chan struct{}) // the last message's handler waits for it
	handling := make(chan struct{})
	credit := func(ctx context.Context, m idemconsume.Message) error {
		if m.Fields["hold"] == "yes" {
			close(handling)
			<-hold
		}
		mu.Lock()
		defer mu.Unlock()
		credited = append(credited, m.Fields["order"])
		return nil
	}
	app := fxtest.New(t, idempotency.Module, regOpt, fx.Supply(zap.NewNop()),
		idempotency.ConsumeStream(idempotency.StreamConsumer{
			Stream: stream, Group: "billing", Operation: "billing.credit", Handler: credit,
			Consumer: []redisstream.Option{redisstream.WithBlock(50 * time.Millisecond)},
		}))
	app.RequireStart()

	for _, v := range []map[string]any{
		{"idempotency-key": "o-1", "order": "1"},
		{"idempotency-key": "o-1", "order": "1"}, // the producer's copy
		{"idempotency-key": "o-2", "order": "2"},
	} {
		if err := rdb.XAdd(t.Context(), &redis.XAddArgs{Stream: stream, Values: v}).Err(); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "three acknowledged deliveries", func() bool {
		mfs, _ := reg.Gather()
		n := 0.0
		for _, r := range []string{"processed", "duplicate"} {
			n += max(counterValue(mfs, "idempotency_consumer_deliveries_total", map[string]string{"operation": "billing.credit", "reason": r}), 0)
		}
		return n == 3 && pending(t, rdb, stream, "billing") == 0
	})

	// Stop waits for the message being handled, and acknowledges it.
	if err := rdb.XAdd(t.Context(), &redis.XAddArgs{Stream: stream, Values: map[string]any{"idempotency-key": "o-3", "order": "3", "hold": "yes"}}).Err(); err != nil {
		t.Fatal(err)
	}
	<-handling
	stopped := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		stopped <- app.Stop(ctx)
	}()
	select {
	case err := <-stopped:
		t.Fatalf("the app stopped with a message in hand: %v", err)
	case <-time.After(200 * time.Millisecond):
	}
	close(hold)
	if err := <-stopped; err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(credited) != 3 || credited[2] != "3" {
		t.Errorf("credited %v, want orders 1, 2 and 3 once each", credited)
	}
	if n := pending(t, rdb, stream, "billing"); n != 0 {
		t.Errorf("%d entries left pending after a clean stop", n)
	}
}

// A group Redis refuses to create fails start-up, naming it.
func TestConsumeStreamFailsStartOnAStreamRedisRefuses(t *testing.T) {
	rdb, prefix := streamEnv(t)
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent(), goredisProbe) // the shared server runs on
	stream := prefix + "not-a-stream"
	if err := rdb.Set(t.Context(), stream, "x", 0).Err(); err != nil {
		t.Fatal(err)
	}
	_, regOpt := registry()
	app := fx.New(fx.NopLogger, idempotency.Module, regOpt, fx.Supply(zap.NewNop()),
		idempotency.ConsumeStream(idempotency.StreamConsumer{
			Stream: stream, Group: "billing", Operation: "billing.credit",
			Handler: func(context.Context, idemconsume.Message) error { return nil },
		}))
	err := app.Start(t.Context())
	if err == nil || !strings.Contains(err.Error(), "WRONGTYPE") {
		t.Fatalf("Start() = %v, want WRONGTYPE", err)
	}
	_ = app.Stop(context.Background())
}

// failingAck is the app's Redis client, whose XACK fails.
type failingAck struct{ *redis.Client }

func (f failingAck) XAck(ctx context.Context, _, _ string, _ ...string) *redis.IntCmd {
	cmd := redis.NewIntCmd(ctx)
	cmd.SetErr(errors.New("XACK refused by the test"))
	return cmd
}

// By default, a failed XACK and a dead letter each give a log line through
// the module's logger and a metric.
func TestConsumeStreamLogsAndCountsFailuresByDefault(t *testing.T) {
	rdb, prefix := streamEnv(t)
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent(), goredisProbe) // the shared server runs on
	stream := prefix + "orders"
	reg, regOpt := registry()
	core, logs := observer.New(zap.WarnLevel)
	handle := func(_ context.Context, m idemconsume.Message) error {
		if m.Fields["bad"] == "yes" {
			return idemconsume.Permanent(errors.New("amount does not parse"))
		}
		return nil
	}
	app := fxtest.New(t, idempotency.Module, regOpt, fx.Supply(zap.New(core)),
		fx.Supply(failingAck{rdb}), idempotency.UseRedisClient[failingAck](),
		idempotency.ConsumeStream(idempotency.StreamConsumer{
			Stream: stream, Group: "billing", Operation: "billing.credit", Handler: handle,
			Consumer: []redisstream.Option{redisstream.WithBlock(50 * time.Millisecond)},
		}))
	app.RequireStart()
	defer app.RequireStop()

	for _, v := range []map[string]any{{"order": "1"}, {"order": "2", "bad": "yes"}} {
		if err := rdb.XAdd(t.Context(), &redis.XAddArgs{Stream: stream, Values: v}).Err(); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "an XACK error and a dead letter counted", func() bool {
		mfs, _ := reg.Gather()
		return counterValue(mfs, "idempotency_consumer_errors_total", map[string]string{"operation": "billing.credit", "command": "xack"}) >= 2 &&
			counterValue(mfs, "idempotency_consumer_dead_letters_total", map[string]string{"operation": "billing.credit", "reason": "permanent_error"}) == 1
	})
	if n := logs.FilterMessage("consumer command failed").FilterField(zap.String("command", "xack")).Len(); n < 2 {
		t.Errorf("%d log lines of a failed XACK, want one per failure (2); logs: %v", n, logs.All())
	}
	dead := logs.FilterMessage("message dead-lettered").All()
	if len(dead) != 1 {
		t.Fatalf("%d dead-letter log lines, want 1; logs: %v", len(dead), logs.All())
	}
	if f := dead[0].ContextMap(); f["reason"] != "permanent_error" || f["operation"] != "billing.credit" || f["error"] == nil || dead[0].LoggerName != "idempotency" {
		t.Errorf("dead-letter line %s %v, want its reason, operation and error", dead[0].LoggerName, f)
	}
	// The dead letter went to the dead-letter stream.
	if n, err := rdb.XLen(t.Context(), stream+redisstream.DeadLetterSuffix).Result(); err != nil || n != 1 {
		t.Errorf("dead-letter stream has %d entries (%v), want 1", n, err)
	}
}
