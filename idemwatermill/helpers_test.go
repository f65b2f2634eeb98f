package idemwatermill_test

import (
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/idemkit/idempotency/coordinator"
	"github.com/idemkit/idempotency/idemconsume"
	"github.com/idemkit/idempotency/idemwatermill"
	"github.com/idemkit/idempotency/internal/redistest"
	"github.com/idemkit/idempotency/redisrepo"
)

// newProcessor returns a Processor of operation "billing.credit" over a
// coordinator on the tests' Redis, under the test's own key prefix; the
// coordinator is closed when the test ends.
func newProcessor(t *testing.T, opts ...idemconsume.Option) *idemconsume.Processor {
	t.Helper()
	rdb := redistest.Server(t)
	c, err := coordinator.New(redisrepo.New(rdb, redisrepo.WithKeyPrefix(redistest.Prefix(t))),
		coordinator.WithLease(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	p, err := idemconsume.New(c, "billing.credit", opts...)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// newDeduplicator returns a Deduplicator over p.
func newDeduplicator(t *testing.T, p *idemconsume.Processor, opts ...idemwatermill.Option) *idemwatermill.Deduplicator {
	t.Helper()
	d, err := idemwatermill.New(p, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// order returns a message with the UUID id and the idempotency key key
// ("" for none).
func order(id, key string) *message.Message {
	m := message.NewMessage(id, []byte("credit 10"))
	if key != "" {
		m.Metadata.Set(idemconsume.DefaultKeyField, key)
	}
	return m
}
