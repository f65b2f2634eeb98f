package redisstream_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idempotency/coordinator"
	"github.com/idemkit/idempotency/coordinator/memstore"
	"github.com/idemkit/idempotency/idemconsume"
	"github.com/idemkit/idempotency/idemconsume/redisstream"
)

// An invalid option makes New return an error naming the option and the
// value, as a *coordinator.OptionError; a nil option is skipped. No Redis
// is reached: New only checks its arguments.
func TestOptionsRule(t *testing.T) {
	c, err := coordinator.New(memstore.New())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	p, err := idemconsume.New(c, "op")
	if err != nil {
		t.Fatal(err)
	}
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	defer rdb.Close()
	h := func(context.Context, idemconsume.Message) error { return nil }
	_, err = redisstream.New(rdb, p, "s", "g", h, redisstream.WithWorkers(0), redisstream.WithStartID(""))
	var oe *coordinator.OptionError
	if !errors.As(err, &oe) || !strings.Contains(err.Error(), "WithWorkers: must be at least 1, got 0") || !strings.Contains(err.Error(), "WithStartID: must not be empty") {
		t.Fatalf("err = %v; want both refusals, as *coordinator.OptionError", err)
	}
	if _, err := redisstream.New(rdb, p, "s", "g", h, nil, redisstream.WithWorkers(2), nil); err != nil {
		t.Fatalf("New with nil options = %v; want them skipped", err)
	}
}
