package main

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idempotency/idemconsume"
	"github.com/idemkit/idempotency/idemconsume/redisstream"
)

// creditScript is the effect: it credits the order's amount to its
// account, and appends the order's key to the log, only if the order was
// not credited before, in one atomic step on the ledger's Redis.
//
// Why the condition, when the consumer already runs each order once? The
// coordinator completes the order's idempotency record after this script
// has run. A consumer killed between the two leaves a reservation that
// expires, and the order's redelivery runs the handler again: without the
// condition that would credit the order twice. With it, the second credit
// is refused (and counted in the fenced key), so the ledger has one credit
// per order wherever the kill lands. The idempotency layer still does the rest: the
// producer's copies, the redeliveries after a lost acknowledgement and the
// orders claimed from a dead consumer never reach the slow part of the
// handler, and a consumer never runs an order that another is running.
var creditScript = redis.NewScript(`
if redis.call('HSETNX', KEYS[1], ARGV[1], ARGV[2]) == 0 then
  redis.call('INCR', KEYS[4])
  return 0
end
redis.call('HINCRBY', KEYS[2], ARGV[2], ARGV[3])
redis.call('RPUSH', KEYS[3], ARGV[1])
return 1
`)

// ledger credits orders.
type ledger struct {
	rdb   redis.UniversalClient
	names names
	work  time.Duration
	quiet bool

	crashAfter int          // -crash-after-credits
	credited   atomic.Int64 // credits this process applied
}

// credit is the consumer's handler: it credits one order.
func (l *ledger) credit(ctx context.Context, m idemconsume.Message) error {
	key, account := m.Fields[idemconsume.DefaultKeyField], m.Fields["account"]
	amount, err := strconv.ParseInt(m.Fields["amount"], 10, 64)
	if err != nil || account == "" {
		// No redelivery will make this order valid: dead-letter it now.
		return idemconsume.Permanent(fmt.Errorf("order %s: amount %q, account %q: not an order", key, m.Fields["amount"], account))
	}
	// The slow part of the work: a call to a ledger service, say.
	t := time.NewTimer(l.work)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
		return ctx.Err()
	}
	n := l.names
	applied, err := creditScript.Run(ctx, l.rdb, []string{n.applied, n.balances, n.log, n.fenced}, key, account, amount).Int()
	if err != nil {
		return fmt.Errorf("credit %s: %w", key, err)
	}
	if applied == 0 && !l.quiet {
		fmt.Printf("%s: already credited: the ledger refused a second credit (a consumer died between the credit and the completion of the record)\n", key)
	}
	if applied == 1 && l.crashAfter > 0 && l.credited.Add(1) == int64(l.crashAfter) {
		// Die in the window: the credit is made, its record not completed.
		fmt.Printf("%s: credited; killing this process before the record is completed (-crash-after-credits)\n", key)
		if self, err := os.FindProcess(os.Getpid()); err == nil {
			_ = self.Kill()
		}
		select {} // until the signal lands
	}
	return nil
}

// consume credits the orders of the stream until ctx ends or, with
// -exit-when-drained, until every entry is acknowledged.
func consume(ctx context.Context, a *app, n names, o options) error {
	l := &ledger{rdb: a.rdb, names: n, work: o.work, quiet: o.quiet, crashAfter: o.crashAfter}
	p, err := idemconsume.New(a.coord, "billing.credit",
		idemconsume.WithMaxDeliveries(o.maxDeliveries),
		// Longer than any order stays pending, and than the producer may
		// publish an order again.
		idemconsume.WithTTL(24*time.Hour))
	if err != nil {
		return err
	}
	st := &stats{n: make(map[idemconsume.Reason]int)}
	opts := []redisstream.Option{
		redisstream.WithWorkers(o.workers),
		redisstream.WithMinIdle(o.minIdle),
		redisstream.WithClaimInterval(o.claimInterval),
		redisstream.WithBlock(min(500*time.Millisecond, o.claimInterval)),
		redisstream.WithDeadLetterStream(n.dead),
		redisstream.WithOnDecision(func(_ context.Context, m idemconsume.Message, d idemconsume.Decision) {
			st.add(d.Reason)
			if !o.quiet {
				line := fmt.Sprintf("%s (entry %s, delivery %d): %v", m.Fields[idemconsume.DefaultKeyField], m.ID, m.Deliveries, d)
				if d.Err != nil {
					line += ": " + d.Err.Error()
				}
				fmt.Println(line)
			}
		}),
		redisstream.WithOnError(func(_ context.Context, err error) { fmt.Println("stream error:", err) }),
	}
	if o.name != "" {
		opts = append(opts, redisstream.WithConsumerName(o.name))
	}
	sc, err := redisstream.New(a.rdb, p, n.stream, n.group, l.credit, opts...)
	if err != nil {
		return err
	}
	fmt.Printf("consumer %s of group %s: crediting the orders of %s with %d workers\n", sc.Name(), n.group, n.stream, o.workers)

	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	if o.exitWhenDrained {
		wg.Go(func() {
			defer cancel()
			for {
				select {
				case <-runCtx.Done():
					return
				case <-time.After(100 * time.Millisecond):
				}
				if ok, err := drained(runCtx, a.rdb, n); err == nil && ok {
					fmt.Println("the stream is drained: every entry is acknowledged")
					return
				}
			}
		})
	}
	err = sc.Run(runCtx)
	cancel()
	wg.Wait()
	if err != nil {
		return err
	}
	fmt.Println("this consumer's decisions:", st)
	return summary(context.WithoutCancel(ctx), a.rdb, n)
}

// drained reports whether the group has read the stream's last entry and
// acknowledged every entry.
func drained(ctx context.Context, rdb redis.UniversalClient, n names) (bool, error) {
	last, err := rdb.XRevRangeN(ctx, n.stream, "+", "-", 1).Result()
	if err != nil || len(last) == 0 {
		return false, err
	}
	groups, err := rdb.XInfoGroups(ctx, n.stream).Result()
	if err != nil {
		return false, err
	}
	for _, g := range groups {
		if g.Name == n.group {
			return g.Pending == 0 && g.LastDeliveredID == last[0].ID, nil
		}
	}
	return false, errors.New("no group yet")
}

// summary prints the ledger.
func summary(ctx context.Context, rdb redis.UniversalClient, n names) error {
	balances, err := rdb.HGetAll(ctx, n.balances).Result()
	if err != nil {
		return err
	}
	credits, _ := rdb.LLen(ctx, n.log).Result()
	fenced, _ := rdb.Get(ctx, n.fenced).Int()
	dead, _ := rdb.XLen(ctx, n.dead).Result()
	fmt.Printf("ledger: %d credits, %d refused as already applied, %d entries dead-lettered to %s\n", credits, fenced, dead, n.dead)
	for _, acct := range slices.Sorted(maps.Keys(balances)) {
		fmt.Printf("  %s: %s\n", acct, balances[acct])
	}
	return nil
}

// stats counts a consumer's decisions.
type stats struct {
	mu sync.Mutex
	n  map[idemconsume.Reason]int
}

func (s *stats) add(r idemconsume.Reason) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.n[r]++
}

func (s *stats) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := ""
	for _, r := range slices.Sorted(maps.Keys(s.n)) {
		out += fmt.Sprintf(" %s=%d", r, s.n[r])
	}
	if out == "" {
		return "none"
	}
	return out[1:]
}
