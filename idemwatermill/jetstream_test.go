package idemwatermill_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wmjs "github.com/ThreeDotsLabs/watermill-nats/v2/pkg/jetstream"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemkit/idempotency/idemconsume"
	"github.com/idemkit/idempotency/idemwatermill"
)

const (
	// durable is the JetStream consumer (the consumer group) of the tests.
	durable = "billing"
	// deliveredField is the metadata field in which deliveriesUnmarshaler
	// puts JetStream's delivery count.
	deliveredField = "nats-num-delivered"
	// waitTimeout bounds every wait for the broker: generous, for a busy
	// machine.
	waitTimeout = 2 * time.Minute
)

// jsEnv is one test's JetStream: a stream of orders with a durable
// consumer, and a stream for the poison queue.
type jsEnv struct {
	url    string
	topic  string // the orders stream, its subject and the subscriber's topic
	poison string // the poison queue's stream and topic
	js     jetstream.JetStream
}

// newJetStream creates the test's streams, and the durable consumer on the
// orders stream, whose unacknowledged messages JetStream redelivers after
// ackWait; they are deleted when the test ends.
func newJetStream(t *testing.T, ackWait time.Duration) *jsEnv {
	t.Helper()
	url := natsURL(t)
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	e := &jsEnv{url: url, topic: "orders_" + watermill.NewShortUUID(), js: js}
	e.poison = e.topic + "_poison"
	ctx := t.Context()
	for _, name := range []string{e.topic, e.poison} {
		if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{name}}); err != nil {
			t.Fatalf("create stream %s: %v", name, err)
		}
		t.Cleanup(func() { _ = js.DeleteStream(context.Background(), name) })
	}
	if _, err := js.CreateOrUpdateConsumer(ctx, e.topic, jetstream.ConsumerConfig{
		Durable: durable, AckPolicy: jetstream.AckExplicitPolicy, AckWait: ackWait, MaxDeliver: -1,
	}); err != nil {
		t.Fatalf("create consumer: %v", err)
	}
	return e
}

// connect returns a connection to url that is closed, and waited for, when
// the test ends (after the router has stopped: Watermill's subscriber only
// drains its connection, which goes on in the background).
func connect(t *testing.T, url string) *nats.Conn {
	t.Helper()
	closed := make(chan struct{})
	nc, err := nats.Connect(url, nats.ClosedHandler(func(*nats.Conn) { close(closed) }))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		nc.Close()
		<-closed
	})
	return nc
}

// publish publishes msgs to topic through a Watermill JetStream publisher.
func (e *jsEnv) publish(t *testing.T, topic string, msgs ...*message.Message) {
	t.Helper()
	pub, err := wmjs.NewPublisher(wmjs.PublisherConfig{URL: e.url, Logger: watermill.NopLogger{}})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	if err := pub.Publish(topic, msgs...); err != nil {
		t.Fatalf("publish: %v", err)
	}
}

// drained reports whether the durable consumer has acknowledged every
// message of the orders stream.
func (e *jsEnv) drained(ctx context.Context) (bool, error) {
	c, err := e.js.Consumer(ctx, e.topic, durable)
	if err != nil {
		return false, err
	}
	info, err := c.Info(ctx)
	if err != nil {
		return false, err
	}
	return info.NumPending == 0 && info.NumAckPending == 0 && info.NumRedelivered == 0, nil
}

// newSubscriber returns a Watermill JetStream subscriber of the durable
// consumer on nc, whose messages carry their delivery count in
// deliveredField.
func newSubscriber(nc *nats.Conn) (*wmjs.Subscriber, error) {
	return wmjs.NewSubscriber(wmjs.SubscriberConfig{
		Conn:   nc,
		Logger: watermill.NopLogger{},
		ResourceInitializer: func(ctx context.Context, js jetstream.JetStream, topic string) (jetstream.Consumer, func(context.Context, watermill.LoggerAdapter), error) {
			c, err := js.Consumer(ctx, topic, durable)
			return c, nil, err
		},
		Unmarshaler: deliveriesUnmarshaler{},
	})
}

// deliveriesUnmarshaler is Watermill's JetStream unmarshaler that also puts
// the message's delivery count (JetStream's NumDelivered) in its metadata,
// for idemwatermill.WithDeliveriesFromMetadata.
type deliveriesUnmarshaler struct{}

func (deliveriesUnmarshaler) Unmarshal(m jetstream.Msg) (*message.Message, error) {
	wm, err := wmjs.DefaultUnmarshaler{}.Unmarshal(m)
	if err != nil {
		return nil, err
	}
	if md, err := m.Metadata(); err == nil {
		wm.Metadata.Set(deliveredField, strconv.FormatUint(md.NumDelivered, 10))
	}
	return wm, nil
}

// runRouter runs router until the test ends, and fails the test if Run
// returns an error.
func runRouter(t *testing.T, router *message.Router) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- router.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("router: %v", err)
		}
	})
	select {
	case <-router.Running():
	case err := <-done:
		t.Fatalf("router: %v", err)
	case <-time.After(waitTimeout):
		t.Fatal("router did not start")
	}
}

// waitFor polls cond until it holds, failing the test after waitTimeout.
func waitFor(t *testing.T, what string, cond func() (bool, error)) {
	t.Helper()
	deadline := time.Now().Add(waitTimeout)
	for {
		ok, err := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v (last error: %v)", what, waitTimeout, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Through a real broker and a real router: a handler that fails is nacked
// and JetStream redelivers its message, which is then processed, not
// dropped; producers' copies are acknowledged without running the handler;
// permanent errors and messages that fail on every delivery reach the poison
// queue (through watermill's PoisonQueueWithFilter and IsDeadLetter); every
// other error is left to redelivery.
func TestJetStreamRedeliversFailedMessages(t *testing.T) {
	const orders, maxDeliveries = 20, 3
	e := newJetStream(t, 30*time.Second)

	var mu sync.Mutex
	runs, effects := map[string]int{}, map[string]int{}
	handler := func(msg *message.Message) error {
		key := msg.Metadata.Get(idemconsume.DefaultKeyField)
		mu.Lock()
		defer mu.Unlock()
		runs[key]++
		switch {
		case key == "order-flaky" && runs[key] <= 2:
			return errors.New("ledger unavailable")
		case key == "order-poison":
			return idemconsume.Permanent(errors.New("amount does not parse"))
		case key == "order-crashy":
			return errors.New("ledger rejects it every time")
		}
		effects[key]++
		return nil
	}

	sub, err := newSubscriber(connect(t, e.url))
	if err != nil {
		t.Fatal(err)
	}
	poisonPub, err := wmjs.NewPublisher(wmjs.PublisherConfig{URL: e.url, Logger: watermill.NopLogger{}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = poisonPub.Close() }) // after the router has stopped
	poison, err := middleware.PoisonQueueWithFilter(poisonPub, e.poison, idemwatermill.IsDeadLetter)
	if err != nil {
		t.Fatal(err)
	}
	dedup := newDeduplicator(t, newProcessor(t, idemconsume.WithMaxDeliveries(maxDeliveries)),
		idemwatermill.WithDeliveriesFromMetadata(deliveredField))
	router, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
	if err != nil {
		t.Fatal(err)
	}
	router.AddMiddleware(poison, dedup.Middleware)
	router.AddConsumerHandler("credit", e.topic, sub, handler)
	runRouter(t, router)

	var msgs []*message.Message
	for i := range orders {
		msgs = append(msgs, order(watermill.NewUUID(), "order-"+strconv.Itoa(i)))
	}
	for i := range 5 { // producers' copies: new UUIDs, the same keys
		msgs = append(msgs, order(watermill.NewUUID(), "order-"+strconv.Itoa(i)))
	}
	for _, key := range []string{"order-flaky", "order-poison", "order-crashy"} {
		msgs = append(msgs, order(watermill.NewUUID(), key))
	}
	e.publish(t, e.topic, msgs...)

	waitFor(t, "every message acknowledged", func() (bool, error) { return e.drained(t.Context()) })

	mu.Lock()
	defer mu.Unlock()
	for i := range orders {
		key := "order-" + strconv.Itoa(i)
		if runs[key] != 1 || effects[key] != 1 {
			t.Errorf("%s: %d runs, %d effects, want 1 and 1", key, runs[key], effects[key])
		}
	}
	if runs["order-flaky"] != 3 || effects["order-flaky"] != 1 {
		t.Errorf("order-flaky (fails twice): %d runs, %d effects; want 3 runs (redelivered after each failure) and 1 effect",
			runs["order-flaky"], effects["order-flaky"])
	}
	if runs["order-poison"] != 1 {
		t.Errorf("order-poison (permanent error): %d runs, want 1", runs["order-poison"])
	}
	if runs["order-crashy"] != maxDeliveries {
		t.Errorf("order-crashy (fails every time): %d runs, want %d (one per allowed delivery)", runs["order-crashy"], maxDeliveries)
	}

	got := e.poisoned(t, 2)
	for key, reason := range map[string]idemconsume.Reason{"order-poison": idemconsume.ReasonPermanent, "order-crashy": idemconsume.ReasonMaxDeliveries} {
		m, ok := got[key]
		if !ok {
			t.Errorf("%s is not in the poison queue (it holds %v)", key, got)
			continue
		}
		if want := "dead_letter (" + string(reason) + ")"; !strings.Contains(m.Metadata.Get(middleware.ReasonForPoisonedKey), want) {
			t.Errorf("%s in the poison queue: reason %q, want it to name %q", key, m.Metadata.Get(middleware.ReasonForPoisonedKey), want)
		}
	}
}

// poisoned reads n messages from the poison stream and returns them by
// idempotency key.
func (e *jsEnv) poisoned(t *testing.T, n int) map[string]*message.Message {
	t.Helper()
	c, err := e.js.CreateOrUpdateConsumer(t.Context(), e.poison, jetstream.ConsumerConfig{AckPolicy: jetstream.AckNonePolicy})
	if err != nil {
		t.Fatal(err)
	}
	batch, err := c.Fetch(n, jetstream.FetchMaxWait(30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]*message.Message{}
	for m := range batch.Messages() {
		wm, err := wmjs.DefaultUnmarshaler{}.Unmarshal(m)
		if err != nil {
			t.Fatal(err)
		}
		got[wm.Metadata.Get(idemconsume.DefaultKeyField)] = wm
	}
	if len(got) != n {
		t.Errorf("the poison queue holds %d messages, want %d", len(got), n)
	}
	return got
}
