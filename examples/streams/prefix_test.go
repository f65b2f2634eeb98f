package main

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idempotency/internal/redistest"
)

// A second run with another -prefix starts from nothing: its orders are
// credited, not taken for duplicates of the first run's, whose records
// are under the first prefix.
func TestPrefixCoversTheIdempotencyRecords(t *testing.T) {
	rdb := redistest.Server(t)
	opts := redistest.ServerOptions(t)
	bin := build(t)
	env := []string{"IDEMPOTENCY_REDIS_URL=redis://" + opts.Addr + "/" + strconv.Itoa(opts.DB)}
	for _, run := range []string{"first", "second"} {
		prefix := redistest.Prefix(t) + run + ":"
		p := runExample(t, bin, env, "demo", "-prefix", prefix, "-messages", "10", "-duplicates", "2",
			"-work", "1ms", "-quiet", "-min-idle", "1s", "-claim-interval", "100ms")
		if err := p.wait(60 * time.Second); err != nil {
			t.Fatalf("%s run: %v\n%s", run, err, p.tail(20))
		}
		n := (&options{prefix: prefix}).names()
		if credits, err := rdb.LLen(context.Background(), n.log).Result(); err != nil || credits != 10 {
			t.Errorf("%s run: %d credits (%v), want the 10 orders\n%s", run, credits, err, p.tail(20))
		}
		if k, err := rdb.Keys(context.Background(), prefix+"idempotency:billing.credit:*").Result(); err != nil || len(k) != 10 {
			t.Errorf("%s run: %d idempotency records under the prefix (%v), want 10", run, len(k), err)
		}
	}
}

// -h names the command as a user types it.
func TestHelpNamesTheCommand(t *testing.T) {
	bin := build(t)
	for _, cmd := range []string{"demo", "produce", "consume"} {
		p := runExample(t, bin, nil, cmd, "-h")
		_ = p.wait(30 * time.Second)
		if out := p.String(); !strings.Contains(out, "Usage of streams "+cmd+":") {
			t.Errorf("streams %s -h says:\n%s", cmd, out)
		}
	}
}
