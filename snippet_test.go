package idempotency_test

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/fx"
	"go.uber.org/goleak"

	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/idemconsume"
	"github.com/idemkit/idempotency/internal/redistest"
)

// Ledger is the service of the docs' snippet.
type Ledger struct{ credited chan string }

// Credit is a handler of the stream of orders.
func (l *Ledger) Credit(_ context.Context, m idemconsume.Message) error {
	l.credited <- m.Fields["order"]
	return nil
}

// The snippet of docs/consumers.md and docs/configuration.md starts as
// written: the code between the markers below is the docs' snippet, which
// TestConsumersSnippetIsTheDocumented checks word for word.
func TestConsumersSnippetStartsAsWritten(t *testing.T) {
	clearEnv(t)
	server := redistest.Start(t) // a server of its own: the snippet's stream is "orders"
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent(), goredisProbe)
	newRedisClient := func(lc fx.Lifecycle) *redis.Client {
		rdb := redis.NewClient(&redis.Options{Addr: server.Addr(), ContextTimeoutEnabled: true})
		lc.Append(fx.StopHook(rdb.Close))
		return rdb
	}
	ledger := &Ledger{credited: make(chan string, 1)}
	newLedger := func() *Ledger { return ledger }

	// snippet: begin
	app := fx.New(
		fx.Provide(newRedisClient, newLedger),       // your *redis.Client, your service
		idempotency.Module,                          // reads IDEMPOTENCY_* from the environment
		idempotency.UseRedisClient[*redis.Client](), // the module and the consumer use your client
		idempotency.ConsumeStreamWith(idempotency.StreamConsumer{
			Stream: "orders", Group: "billing", Operation: "billing.credit",
		}, func(l *Ledger) idemconsume.Handler { return l.Credit }),
	)
	// snippet: end

	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if err := app.Start(ctx); err != nil {
		t.Fatal(err)
	}
	rdb := server.Client(t)
	if err := rdb.XAdd(ctx, &redis.XAddArgs{Stream: "orders", Values: map[string]any{"idempotency-key": "o-1", "order": "1"}}).Err(); err != nil {
		t.Fatal(err)
	}
	select {
	case got := <-ledger.credited:
		if got != "1" {
			t.Errorf("credited order %q, want 1", got)
		}
	case <-ctx.Done():
		t.Fatal("the consumer processed nothing")
	}
	if err := app.Stop(ctx); err != nil {
		t.Fatal(err)
	}
}

// The docs show the snippet above as it is, so that what a user copies is
// what the test starts.
func TestConsumersSnippetIsTheDocumented(t *testing.T) {
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
	snippet := "```go\n" + strings.Join(lines, "\n") + "\n"
	for _, doc := range []string{"docs/consumers.md", "docs/configuration.md"} {
		text, err := os.ReadFile(doc)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(text), snippet) {
			t.Errorf("%s does not show the snippet of TestConsumersSnippetStartsAsWritten as it is:\n%s", doc, snippet)
		}
	}
}
