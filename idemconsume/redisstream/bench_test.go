package redisstream

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idempotency/coordinator"
	"github.com/idemkit/idempotency/idemconsume"
	"github.com/idemkit/idempotency/internal/redistest"
	"github.com/idemkit/idempotency/redisrepo"
)

// BenchmarkConsume processes new entries read from a stream 500 at a time
// (one op is one entry), on a real Redis: path=batch is what a Consumer
// does, ProcessBatch and one XACK per read; path=per-message is the path
// before it, Process and an XACK per entry. The handler does nothing, so
// the figure is the cost of the idempotency and the acknowledgements.
func BenchmarkConsume(b *testing.B) {
	for _, path := range []string{"per-message", "batch"} {
		b.Run("path="+path, func(b *testing.B) {
			rdb := redistest.Server(b)
			prefix := redistest.Prefix(b)
			c, err := coordinator.New(redisrepo.New(rdb, redisrepo.WithKeyPrefix(prefix+"idem:")))
			if err != nil {
				b.Fatal(err)
			}
			defer c.Close()
			p, err := idemconsume.New(c, "bench.credit")
			if err != nil {
				b.Fatal(err)
			}
			handle := func(context.Context, idemconsume.Message) error { return nil }
			cons, err := New(rdb, p, prefix+"orders", "billing", handle, WithBatchSize(500))
			if err != nil {
				b.Fatal(err)
			}
			ctx := b.Context()
			if err := cons.createGroup(ctx); err != nil {
				b.Fatal(err)
			}
			publish(b, rdb, cons.stream, b.N)
			b.ResetTimer()
			for done := 0; done < b.N; {
				streams, err := rdb.XReadGroup(ctx, &redis.XReadGroupArgs{
					Group: cons.group, Consumer: "bench", Streams: []string{cons.stream, ">"}, Count: 500, Block: -1,
				}).Result()
				if err != nil {
					b.Fatal(err)
				}
				msgs := make([]idemconsume.Message, 0, 500)
				for _, m := range entries(streams) {
					msgs = append(msgs, message(m, 1))
				}
				if path == "batch" {
					cons.process(ctx, msgs)
				} else {
					for _, m := range msgs {
						cons.processOne(ctx, m)
					}
				}
				done += len(msgs)
			}
			b.StopTimer()
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
			if n, err := rdb.XPending(ctx, cons.stream, cons.group).Result(); err != nil || n.Count != 0 {
				b.Fatalf("after the run: %v pending, %v; want every entry acknowledged", n, err)
			}
		})
	}
}

// processOne is the per-message path: Process, then its own XACK.
func (c *Consumer) processOne(ctx context.Context, msg idemconsume.Message) {
	d := c.proc.Process(ctx, msg, c.handle)
	if d.Action != idemconsume.Ack {
		panic(fmt.Sprintf("decision %v (%v)", d, d.Err))
	}
	if err := c.client.XAck(ctx, c.stream, c.group, msg.ID).Err(); err != nil {
		panic(err)
	}
}

// publish adds n entries with distinct keys to stream, pipelined.
func publish(b *testing.B, rdb *redis.Client, stream string, n int) {
	b.Helper()
	for start := 0; start < n; start += 1000 {
		pipe := rdb.Pipeline()
		for i := start; i < min(start+1000, n); i++ {
			pipe.XAdd(b.Context(), &redis.XAddArgs{Stream: stream, Values: []any{"idempotency-key", "order-" + strconv.Itoa(i), "amount", "5"}})
		}
		if _, err := pipe.Exec(b.Context()); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkTakeover processes entries that a dead consumer left pending
// (one op is one entry), found idle and claimed by a worker as a Consumer
// does, with WithBatchSize(500): deliveries=1 is a first takeover (claimed
// 500 at a time), deliveries=4 entries delivered four times with the
// default WithMaxDeliveries(5) (claimed one at a time, so that a crash
// charges no other entry).
func BenchmarkTakeover(b *testing.B) {
	for _, delivered := range []int{1, 4} {
		b.Run("deliveries="+strconv.Itoa(delivered), func(b *testing.B) {
			rdb := redistest.Server(b)
			prefix := redistest.Prefix(b)
			c, err := coordinator.New(redisrepo.New(rdb, redisrepo.WithKeyPrefix(prefix+"idem:")))
			if err != nil {
				b.Fatal(err)
			}
			defer c.Close()
			p, err := idemconsume.New(c, "bench.credit")
			if err != nil {
				b.Fatal(err)
			}
			handle := func(context.Context, idemconsume.Message) error { return nil }
			cons, err := New(rdb, p, prefix+"orders", "billing", handle, WithBatchSize(500), WithMinIdle(time.Millisecond))
			if err != nil {
				b.Fatal(err)
			}
			ctx := b.Context()
			if err := cons.createGroup(ctx); err != nil {
				b.Fatal(err)
			}
			publish(b, rdb, cons.stream, b.N)
			ids, err := rdb.XReadGroup(ctx, &redis.XReadGroupArgs{
				Group: cons.group, Consumer: "dead", Streams: []string{cons.stream, ">"}, Count: int64(b.N), Block: -1,
			}).Result()
			if err != nil {
				b.Fatal(err)
			}
			if delivered > 1 {
				pipe := rdb.Pipeline()
				for _, m := range entries(ids) {
					pipe.Do(ctx, "XCLAIM", cons.stream, cons.group, "dead", 0, m.ID, "RETRYCOUNT", delivered, "JUSTID")
				}
				if _, err := pipe.Exec(ctx); err != nil {
					b.Fatal(err)
				}
			}
			time.Sleep(2 * time.Millisecond) // idle for WithMinIdle
			w := &worker{c: cons, name: "bench"}
			b.ResetTimer()
			for done := 0; done < b.N; {
				msgs, err := w.next(ctx)
				if err != nil {
					b.Fatal(err)
				}
				if len(msgs) > 0 && msgs[0].Deliveries != int64(delivered)+1 {
					b.Fatalf("claimed at delivery %d, want %d", msgs[0].Deliveries, delivered+1)
				}
				cons.process(ctx, msgs)
				done += len(msgs)
			}
			b.StopTimer()
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
			if n, err := rdb.XPending(ctx, cons.stream, cons.group).Result(); err != nil || n.Count != 0 {
				b.Fatalf("after the run: %v pending, %v; want every entry acknowledged", n, err)
			}
		})
	}
}
