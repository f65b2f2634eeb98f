package idemwatermill_test

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wmjs "github.com/ThreeDotsLabs/watermill-nats/v2/pkg/jetstream"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idempotency/coordinator"
	"github.com/idemkit/idempotency/idemconsume"
	"github.com/idemkit/idempotency/idemwatermill"
	"github.com/idemkit/idempotency/internal/redistest"
	"github.com/idemkit/idempotency/redisrepo"
)

// snippetLedger is the service of the docs' snippet.
type snippetLedger struct{ credited chan string }

func (l *snippetLedger) Credit(msg *message.Message) error {
	l.credited <- msg.Metadata.Get("idempotency-key")
	return nil
}

// runSnippet is the snippet of docs/consumers.md, between the markers.
func runSnippet(ctx context.Context, rdb *redis.Client, pub message.Publisher, sub message.Subscriber,
	logger watermill.LoggerAdapter, ledger *snippetLedger) error {
	// snippet: begin
	c, err := coordinator.New(redisrepo.New(rdb)) // or the *coordinator.Coordinator of idempotency.Module
	if err != nil {
		return err
	}
	defer c.Close()
	p, err := idemconsume.New(c, "billing.credit", idemconsume.WithMaxDeliveries(5))
	if err != nil {
		return err
	}
	dedup, err := idemwatermill.New(p, idemwatermill.WithDeliveriesFromMetadata("nats-num-delivered"))
	if err != nil {
		return err
	}
	poison, err := middleware.PoisonQueueWithFilter(pub, "orders_poison", idemwatermill.IsDeadLetter)
	if err != nil {
		return err
	}
	router, err := message.NewRouter(message.RouterConfig{}, logger)
	if err != nil {
		return err
	}
	router.AddMiddleware(poison, dedup.Middleware) // the poison queue outermost
	router.AddConsumerHandler("credit", "orders", sub, ledger.Credit)
	return router.Run(ctx) // until ctx ends
	// snippet: end
}

// The snippet of docs/consumers.md runs as written, on NATS JetStream and a
// redis-server of its own (the snippet uses the store's default key
// prefix): a message and its copy are credited once.
func TestDocsSnippetRunsAsWritten(t *testing.T) {
	server := redistest.Start(t)
	e := newJetStream(t, 30*time.Second)
	for _, name := range []string{"orders", "orders_poison"} {
		if _, err := e.js.CreateStream(t.Context(), jetstream.StreamConfig{Name: name, Subjects: []string{name}}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = e.js.DeleteStream(context.Background(), name) })
	}
	if _, err := e.js.CreateOrUpdateConsumer(t.Context(), "orders", jetstream.ConsumerConfig{Durable: durable, AckPolicy: jetstream.AckExplicitPolicy}); err != nil {
		t.Fatal(err)
	}
	pub, err := wmjs.NewPublisher(wmjs.PublisherConfig{URL: e.url, Logger: watermill.NopLogger{}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pub.Close() })
	sub, err := newSubscriber(connect(t, e.url))
	if err != nil {
		t.Fatal(err)
	}
	ledger := &snippetLedger{credited: make(chan string, 10)}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- runSnippet(ctx, server.Client(t), pub, sub, watermill.NopLogger{}, ledger) }()

	e.publish(t, "orders", order(watermill.NewUUID(), "order-1"), order(watermill.NewUUID(), "order-1"), order(watermill.NewUUID(), "order-2"))
	for _, want := range []string{"order-1", "order-2"} {
		select {
		case got := <-ledger.credited:
			if got != want {
				t.Errorf("credited %s, want %s", got, want)
			}
		case err := <-done:
			t.Fatalf("the snippet returned: %v", err)
		case <-time.After(waitTimeout):
			t.Fatalf("%s was not credited", want)
		}
	}
	e.topic = "orders"
	waitFor(t, "every message acknowledged", func() (bool, error) { return e.drained(t.Context()) })
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("the snippet returned: %v", err)
	}
	select {
	case got := <-ledger.credited:
		t.Errorf("%s credited a second time", got)
	default:
	}
}

// docs/consumers.md shows the snippet above as it is, so that what a user
// copies is what the test runs.
func TestDocsSnippetIsTheDocumented(t *testing.T) {
	text, err := os.ReadFile("../docs/consumers.md")
	if errors.Is(err, os.ErrNotExist) {
		t.Skip("docs/consumers.md is not beside the module")
	}
	if err != nil {
		t.Fatal(err)
	}
	src, err := os.ReadFile("snippet_test.go")
	if err != nil {
		t.Fatal(err)
	}
	_, rest, _ := strings.Cut(string(src), "\t// snippet: begin\n")
	code, _, ok := strings.Cut(rest, "\t// snippet: end\n")
	if !ok {
		t.Fatal("no snippet in snippet_test.go")
	}
	var lines []string
	for line := range strings.SplitSeq(strings.TrimSuffix(code, "\n"), "\n") {
		line = strings.TrimPrefix(line, "\t")
		indent := len(line) - len(strings.TrimLeft(line, "\t"))
		lines = append(lines, strings.Repeat("    ", indent)+line[indent:])
	}
	snippet := "```go\n" + strings.Join(lines, "\n") + "\n```"
	if !strings.Contains(string(text), snippet) {
		t.Errorf("docs/consumers.md does not show the snippet of runSnippet as it is:\n%s", snippet)
	}
}
