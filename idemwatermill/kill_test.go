package idemwatermill_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/nats-io/nats.go"
	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idempotency/coordinator"
	"github.com/idemkit/idempotency/idemconsume"
	"github.com/idemkit/idempotency/idemwatermill"
	"github.com/idemkit/idempotency/internal/redistest"
	"github.com/idemkit/idempotency/redisrepo"
)

// The consumer child process: the test binary started with childEnv set
// runs runChild instead of the tests. Its configuration comes in these
// variables.
const (
	childEnv    = "IDEMWATERMILL_TEST_CHILD"
	childNATS   = "IDEMWATERMILL_TEST_NATS_URL"
	childRedis  = "IDEMWATERMILL_TEST_REDIS_ADDR"
	childDB     = "IDEMWATERMILL_TEST_REDIS_DB"
	childPrefix = "IDEMWATERMILL_TEST_PREFIX"
	childTopic  = "IDEMWATERMILL_TEST_TOPIC"
)

// creditScript is the consumer's effect: it credits an order once, and
// counts a second credit of the same order as refused instead. The
// condition closes the window that idemconsume cannot (a consumer killed
// after the credit, before the coordinator completed the record); the
// refusals count how often a handler ran twice for one order.
var creditScript = redis.NewScript(`
if redis.call('HSETNX', KEYS[1], ARGV[1], 1) == 1 then
	redis.call('HINCRBY', KEYS[2], ARGV[1], 1)
	return 1
end
redis.call('HINCRBY', KEYS[3], ARGV[1], 1)
return 0`)

// ledgerKeys are the keys of creditScript under prefix: the orders applied,
// the credits per order, the refusals per order.
func ledgerKeys(prefix string) []string {
	return []string{prefix + "ledger:applied", prefix + "ledger:credits", prefix + "ledger:refused"}
}

// 300 orders and 60 copies of them (30 republished under their UUID, 30
// under UUIDs of their own with the same key) go through NATS JetStream to a
// consumer process, which is SIGKILLed three times mid-stream and
// restarted. Every order is credited exactly once; the handler ran a second
// time for an order at most once per kill (the crash window between the
// effect and the completion of the record, which the credit's own condition
// refuses): the copies and the redeliveries after lost acknowledgements
// never reach it.
func TestJetStreamConsumerKilledMidStream(t *testing.T) {
	const orders, kills = 300, 3
	redistest.NeedRedisServer(t)
	e := newJetStream(t, 2*time.Second) // a killed consumer's messages come back after 2s
	rdb := redistest.Server(t)
	ropts := redistest.ServerOptions(t)
	prefix := redistest.Prefix(t)

	var msgs []*message.Message
	var sameUUID, newUUID int
	for i := range orders {
		msgs = append(msgs, order(watermill.NewUUID(), "order-"+strconv.Itoa(i)))
		if i%10 == 9 {
			msgs = append(msgs, msgs[len(msgs)-4])                                      // republished as it was
			msgs = append(msgs, order(watermill.NewUUID(), "order-"+strconv.Itoa(i-7))) // a copy with a UUID of its own
			sameUUID++
			newUUID++
		}
	}
	e.publish(t, e.topic, msgs...)
	t.Logf("published %d orders and %d copies (%d under the original's UUID, %d under a new one)", orders, sameUUID+newUUID, sameUUID, newUUID)

	env := append(os.Environ(), childEnv+"=consume", childNATS+"="+e.url, childRedis+"="+ropts.Addr,
		childDB+"="+strconv.Itoa(ropts.DB), childPrefix+"="+prefix, childTopic+"="+e.topic)
	credits := func() (int64, error) { return rdb.HLen(t.Context(), ledgerKeys(prefix)[1]).Result() }
	for k := range kills {
		child := startChild(t, env)
		at := int64(orders * (k + 1) / (kills + 1)) // 75, 150, 225
		waitFor(t, fmt.Sprintf("consumer %d reaches %d credits", k+1, at), func() (bool, error) {
			if child.exited() {
				t.Fatalf("consumer %d exited on its own:\n%s", k+1, child.output())
			}
			n, err := credits()
			return n >= at, err
		})
		child.kill(t)
		n, _ := credits()
		t.Logf("consumer %d SIGKILLed at %d credits", k+1, n)
	}
	last := startChild(t, env)
	waitFor(t, "the last consumer drains the stream", func() (bool, error) {
		if last.exited() {
			t.Fatalf("the last consumer exited on its own:\n%s", last.output())
		}
		if n, err := credits(); n < orders || err != nil {
			return false, err
		}
		return e.drained(t.Context())
	})
	last.kill(t)

	keys := ledgerKeys(prefix)
	credited, err := rdb.HGetAll(t.Context(), keys[1]).Result()
	if err != nil {
		t.Fatal(err)
	}
	for i := range orders {
		if c := credited["order-"+strconv.Itoa(i)]; c != "1" {
			t.Errorf("order-%d credited %q times, want 1", i, c)
		}
	}
	if len(credited) != orders {
		t.Errorf("%d orders credited, want %d", len(credited), orders)
	}
	refused, err := rdb.HGetAll(t.Context(), keys[2]).Result()
	if err != nil {
		t.Fatal(err)
	}
	total := 0
	for _, v := range refused {
		n, _ := strconv.Atoi(v)
		total += n
	}
	t.Logf("second runs of a handler refused by the credit's condition: %d (at most %d: one per kill)", total, kills)
	if total > kills {
		t.Errorf("the handler ran a second time for an order %d times (%v), want at most %d, one per kill: "+
			"copies or redeliveries of completed orders reached the handler", total, refused, kills)
	}
}

// child is a consumer process.
type child struct {
	cmd  *exec.Cmd
	out  *syncBuffer
	done chan struct{}
}

// startChild starts the test binary as a consumer with env.
func startChild(t *testing.T, env []string) *child {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = env
	out := &syncBuffer{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	c := &child{cmd: cmd, out: out, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(c.done) }()
	t.Cleanup(func() { c.kill(t) })
	return c
}

func (c *child) exited() bool {
	select {
	case <-c.done:
		return true
	default:
		return false
	}
}

func (c *child) output() string { return c.out.String() }

// kill SIGKILLs the consumer and waits for it to exit.
func (c *child) kill(t *testing.T) {
	t.Helper()
	_ = c.cmd.Process.Signal(syscall.SIGKILL)
	<-c.done
}

// syncBuffer is a bytes.Buffer safe for a process's stdout and stderr at
// once.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// runChild is the consumer of TestJetStreamConsumerKilledMidStream: a
// Watermill router that credits orders through idemwatermill, until it is
// killed. It returns the process's exit code when it cannot start.
func runChild() int {
	fail := func(err error) int { fmt.Fprintln(os.Stderr, "consumer:", err); return 1 }
	db, _ := strconv.Atoi(os.Getenv(childDB))
	rdb := redis.NewClient(&redis.Options{Addr: os.Getenv(childRedis), DB: db})
	prefix := os.Getenv(childPrefix)
	// A killed consumer's reservation outlives it by a lease: keep it short.
	c, err := coordinator.New(redisrepo.New(rdb, redisrepo.WithKeyPrefix(prefix+"idem:")), coordinator.WithLease(2*time.Second))
	if err != nil {
		return fail(err)
	}
	p, err := idemconsume.New(c, "billing.credit", idemconsume.WithMaxDeliveries(100))
	if err != nil {
		return fail(err)
	}
	dedup, err := idemwatermill.New(p, idemwatermill.WithDeliveriesFromMetadata(deliveredField))
	if err != nil {
		return fail(err)
	}
	nc, err := nats.Connect(os.Getenv(childNATS))
	if err != nil {
		return fail(err)
	}
	sub, err := newSubscriber(nc)
	if err != nil {
		return fail(err)
	}
	router, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
	if err != nil {
		return fail(err)
	}
	router.AddMiddleware(dedup.Middleware)
	keys := ledgerKeys(prefix)
	router.AddConsumerHandler("credit", os.Getenv(childTopic), sub, func(msg *message.Message) error {
		time.Sleep(time.Millisecond) // the rest of the handler's work: a kill lands in it too
		return creditScript.Run(msg.Context(), rdb, keys, msg.Metadata.Get(idemconsume.DefaultKeyField)).Err()
	})
	return fail(router.Run(context.Background()))
}
