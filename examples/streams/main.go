// Command streams credits accounts from a Redis stream with idemkit's
// idemconsume/redisstream consumer: every order message is credited once,
// although the producer publishes some orders twice, acknowledgements get
// lost, and the consumer may be killed at any moment. The idempotency layer
// is not exactly-once by itself (see docs/consumers.md): a consumer killed
// between the credit and the completion of the order's record runs it again,
// and the credit's own check on the ledger refuses the second credit.
//
// Run it with
//
//	go run ./examples/streams
//
// Without IDEMPOTENCY_REDIS_URL it starts an embedded Redis (miniredis), so
// it needs nothing installed. It publishes the orders, consumes them until
// the stream is drained, and prints what it did. With a real Redis, the two
// halves run as separate processes, and the consumer can be killed and
// restarted (see docs/consumers.md):
//
//	export IDEMPOTENCY_REDIS_URL=redis://localhost:6379/0
//	go run ./examples/streams produce -messages 200 -duplicates 40
//	go run ./examples/streams consume -workers 4 -work 20ms   # kill -9 it, run it again
//
// The files: main.go (the commands and the wiring), produce.go (the
// producer), consume.go (the consumer and its effect).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/coordinator"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "streams:", err)
		os.Exit(1)
	}
}

// usage is printed for an unknown command.
const usage = `usage: streams [produce|consume|demo] [flags]

  produce   publish -messages orders (and -duplicates of them) to the stream
  consume   credit the orders of the stream, once each, until stopped
  demo      both, then print the balances (the default)

Run "streams <command> -h" for the flags of each.`

// run runs the command of args.
func run(ctx context.Context, args []string) error {
	cmd := "demo"
	if len(args) > 0 && args[0] != "" && args[0][0] != '-' {
		cmd, args = args[0], args[1:]
	}
	// "Usage of streams demo:", not "Usage of demo:".
	fs := flag.NewFlagSet("streams "+cmd, flag.ContinueOnError)
	var o options
	o.common(fs)
	switch cmd {
	case "produce":
		o.produceFlags(fs)
	case "consume":
		o.consumeFlags(fs)
	case "demo":
		o.produceFlags(fs)
		o.consumeFlags(fs)
	default:
		fmt.Fprintln(os.Stderr, usage)
		return fmt.Errorf("unknown command %q", cmd)
	}
	if err := fs.Parse(args); err != nil {
		return err
	}

	app, err := open(ctx, cmd == "demo", o.prefix)
	if err != nil {
		return err
	}
	defer app.close()
	names := o.names()
	switch cmd {
	case "produce":
		return produce(ctx, app.rdb, names, o.messages, o.duplicates)
	case "consume":
		return consume(ctx, app, names, o)
	}
	// demo
	fmt.Printf("publishing %d orders, %d of them twice, and one that cannot be parsed, to %s\n",
		o.messages, o.duplicates, names.stream)
	if err := produce(ctx, app.rdb, names, o.messages, o.duplicates); err != nil {
		return err
	}
	o.exitWhenDrained = true
	return consume(ctx, app, names, o)
}

// options are the command-line flags.
type options struct {
	prefix string

	messages, duplicates int

	workers         int
	work            time.Duration
	name            string
	minIdle         time.Duration
	claimInterval   time.Duration
	maxDeliveries   int
	exitWhenDrained bool
	quiet           bool
	crashAfter      int
}

func (o *options) common(fs *flag.FlagSet) {
	fs.StringVar(&o.prefix, "prefix", "streams-example:", "prefix of every Redis key of the example: the stream, the ledger, and the idempotency records (before IDEMPOTENCY_KEY_PREFIX)")
}

func (o *options) produceFlags(fs *flag.FlagSet) {
	fs.IntVar(&o.messages, "messages", 100, "how many orders to publish")
	fs.IntVar(&o.duplicates, "duplicates", 20, "how many of them the producer publishes a second time, with the same idempotency key")
}

func (o *options) consumeFlags(fs *flag.FlagSet) {
	fs.IntVar(&o.workers, "workers", 4, "how many orders to credit at once")
	fs.DurationVar(&o.work, "work", 10*time.Millisecond, "how long crediting an order takes before its effect (a call to a slow ledger)")
	fs.StringVar(&o.name, "name", "", "the consumer's name in the group; a restart under the same name takes its pending orders back at once (default: new each start)")
	fs.DurationVar(&o.minIdle, "min-idle", 30*time.Second, "how long an order stays pending before another consumer claims it")
	fs.DurationVar(&o.claimInterval, "claim-interval", 5*time.Second, "how often each worker looks for orders to claim")
	fs.IntVar(&o.maxDeliveries, "max-deliveries", 5, "deliveries before an order that keeps failing is dead-lettered")
	fs.BoolVar(&o.exitWhenDrained, "exit-when-drained", false, "exit once every order of the stream is acknowledged")
	fs.BoolVar(&o.quiet, "quiet", false, "print no line per order")
	fs.IntVar(&o.crashAfter, "crash-after-credits", 0, "kill this process right after its n-th credit, before the order's record is completed: the crash window (0: never)")
}

// names are the Redis keys of the example.
type names struct {
	stream, group, dead string
	// The ledger's keys share the hash tag {ledger}, so that the effect's
	// script may touch them all on Redis Cluster too.
	applied  string // HASH: idempotency key -> account, for every order credited
	balances string // HASH: account -> balance
	log      string // LIST: the idempotency key of every credit, in order
	fenced   string // STRING: how many credits the ledger refused as already applied
}

func (o *options) names() names {
	return names{
		stream:   o.prefix + "orders",
		group:    "billing",
		dead:     o.prefix + "orders:dead",
		applied:  o.prefix + "{ledger}:applied",
		balances: o.prefix + "{ledger}:balances",
		log:      o.prefix + "{ledger}:log",
		fenced:   o.prefix + "{ledger}:fenced",
	}
}

// app is the example's Redis client and coordinator.
type app struct {
	rdb   redis.UniversalClient
	coord *coordinator.Coordinator
	close func()
}

// open connects to the Redis of IDEMPOTENCY_REDIS_URL, or, for the demo when
// it is unset, to an embedded one; and builds the coordinator from the
// IDEMPOTENCY_* settings, without fx: the library's constructors are all
// exported. The idempotency records are under prefix too, so that a run
// with another -prefix starts from nothing.
func open(ctx context.Context, demo bool, prefix string) (*app, error) {
	s, err := idempotency.LoadSettings()
	if err != nil {
		return nil, err
	}
	var closers []func()
	closeAll := func() {
		for i := len(closers) - 1; i >= 0; i-- {
			closers[i]()
		}
	}
	if os.Getenv("IDEMPOTENCY_REDIS_URL") == "" && len(s.RedisClusterAddrs) == 0 {
		if !demo {
			return nil, errors.New("set IDEMPOTENCY_REDIS_URL: the producer and the consumer must share a Redis (only the demo starts an embedded one)")
		}
		m := miniredis.NewMiniRedis()
		if err := m.StartAddr("127.0.0.1:0"); err != nil {
			return nil, fmt.Errorf("start embedded redis: %w", err)
		}
		closers = append(closers, m.Close)
		s.RedisURL = "redis://" + m.Addr() + "/0"
		fmt.Printf("IDEMPOTENCY_REDIS_URL is unset: using an embedded Redis (miniredis) at %s\n", m.Addr())
	}
	rdb, err := idempotency.NewRedisClient(s)
	if err != nil {
		closeAll()
		return nil, err
	}
	closers = append(closers, func() { _ = rdb.Close() })
	if err := rdb.Ping(ctx).Err(); err != nil {
		closeAll()
		return nil, fmt.Errorf("ping redis: %w", err)
	}
	s.KeyPrefix = prefix + s.KeyPrefix
	store := idempotency.NewStore(s, rdb)
	c, err := coordinator.New(store, s.CoordinatorOptions()...)
	if err != nil {
		closeAll()
		return nil, err
	}
	// Close waits for the coordinator's background work: it runs before the
	// client closes.
	closers = append(closers, func() { _ = c.Close() })
	return &app{rdb: rdb, coord: c, close: closeAll}, nil
}
