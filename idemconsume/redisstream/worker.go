package redisstream

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idempotency/idemconsume"
)

// Back-off of a worker whose stream commands fail.
const (
	minBackoff = 100 * time.Millisecond
	maxBackoff = 5 * time.Second
)

// worker is one consumer of the group.
type worker struct {
	c       *Consumer
	name    string
	history string              // the ID after which to read this consumer's own pending entries; "" once read
	cursor  string              // where the scan for idle entries goes on (XPENDING's start); "" is "-"
	claimAt time.Time           // when to scan next
	idle    []redis.XPendingExt // entries the scan found idle, not yet claimed
	backoff time.Duration
}

func (w *worker) run(ctx, hctx context.Context) {
	for ctx.Err() == nil {
		batch, err := w.next(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			w.c.reportError(ctx, err)
			if isNoGroup(err) {
				// The stream or the group was deleted: make them again.
				_ = w.c.createGroup(ctx)
			}
			w.backoff = min(max(2*w.backoff, minBackoff), maxBackoff)
			sleep(ctx, w.backoff)
			continue
		}
		w.backoff = 0
		// A batch read while Stop began is in hand: Redis counted its
		// delivery, so it is processed while the handlers' context lives
		// (Stop's grace), rather than left pending to come back one
		// delivery nearer its limit.
		if len(batch) > 0 && hctx.Err() == nil {
			w.c.process(hctx, batch)
		}
	}
}

// next returns the next entries to process: this consumer's own pending
// entries first, then, every claim interval, entries idle elsewhere, else
// new entries.
//
// A read or a claim charges a delivery to every entry it returns, so a
// consumer that dies on one entry (an out-of-memory, a crash in a C
// library) charges a delivery to the batch-mates it had not reached too.
// Entries are taken again so that this never dead-letters them: its own
// pending entries one at a time; idle entries together while their
// deliveries leave room for one more crash and a delivery of their own
// (at most WithMaxDeliveries minus 2), else one at a time, each charged
// only for itself. The search for idle entries (XPENDING ... IDLE) charges
// nothing; an entry it found is claimed (XCLAIM, with the same min-idle
// time) when its turn comes, if it is still idle.
func (w *worker) next(ctx context.Context) ([]idemconsume.Message, error) {
	c := w.c
	if w.history != "" {
		streams, err := c.client.XReadGroup(ctx, &redis.XReadGroupArgs{
			Group: c.group, Consumer: w.name, Streams: []string{c.stream, w.history}, Count: 1, Block: -1,
		}).Result()
		if err != nil && !errors.Is(err, redis.Nil) {
			return nil, cmdErr(CommandReadGroup, fmt.Errorf("redisstream: XREADGROUP %s of own pending entries: %w", c.stream, err))
		}
		msgs := entries(streams)
		if len(msgs) == 0 {
			w.history = ""
			return nil, nil
		}
		w.history = msgs[len(msgs)-1].ID
		return w.counted(ctx, msgs), nil
	}
	if len(w.idle) > 0 {
		p := w.idle[0]
		w.idle = w.idle[1:]
		return w.claim(ctx, []redis.XPendingExt{p}), nil
	}
	if now := time.Now(); !now.Before(w.claimAt) {
		idle, err := c.client.XPendingExt(ctx, &redis.XPendingExtArgs{
			Stream: c.stream, Group: c.group, Idle: c.cfg.minIdle,
			Start: cmp.Or(w.cursor, "-"), End: "+", Count: c.cfg.batch,
		}).Result()
		switch {
		case err != nil:
			// Reported, and the read below goes on: a search that keeps
			// failing must not stop the new entries. The next one waits a
			// claim interval.
			if ctx.Err() != nil {
				return nil, nil
			}
			c.reportError(ctx, cmdErr(CommandPending, fmt.Errorf("redisstream: XPENDING %s IDLE: %w", c.stream, err)))
			w.cursor, w.claimAt = "", now.Add(c.cfg.claimInterval)
		default:
			if int64(len(idle)) < c.cfg.batch {
				// The whole pending list was searched: wait a claim interval.
				w.cursor, w.claimAt = "", now.Add(c.cfg.claimInterval)
			} else {
				w.cursor = "(" + idle[len(idle)-1].ID
			}
			room := c.proc.MaxDeliveries() - 2
			var together []redis.XPendingExt
			for _, p := range idle {
				if p.RetryCount <= room {
					together = append(together, p)
				} else {
					w.idle = append(w.idle, p)
				}
			}
			if len(together) > 0 {
				return w.claim(ctx, together), nil
			}
			if len(w.idle) > 0 {
				return w.next(ctx)
			}
		}
	}
	streams, err := c.client.XReadGroup(ctx, &redis.XReadGroupArgs{
		Group: c.group, Consumer: w.name, Streams: []string{c.stream, ">"}, Count: c.cfg.batch,
		Block: min(c.cfg.block, max(time.Until(w.claimAt), time.Millisecond)),
	}).Result()
	if err != nil && !errors.Is(err, redis.Nil) {
		return nil, cmdErr(CommandReadGroup, fmt.Errorf("redisstream: XREADGROUP %s: %w", c.stream, err))
	}
	msgs := entries(streams)
	out := make([]idemconsume.Message, len(msgs))
	for i, m := range msgs {
		out[i] = message(m, 1) // a new entry's first delivery
	}
	return out, nil
}

// claim claims the entries ps that the search found idle (XCLAIM, with the
// same min-idle time, which charges their deliveries) and returns those it
// got: not an entry that is not idle any more (another consumer claimed it
// since, or its own consumer read it again), nor one acknowledged or
// deleted meanwhile. When XCLAIM fails, the error is reported and the
// entries found are left for the next search, a claim interval later.
func (w *worker) claim(ctx context.Context, ps []redis.XPendingExt) []idemconsume.Message {
	c := w.c
	ids := make([]string, len(ps))
	counts := make(map[string]int64, len(ps))
	for i, p := range ps {
		ids[i] = p.ID
		counts[p.ID] = p.RetryCount
	}
	msgs, err := c.client.XClaim(ctx, &redis.XClaimArgs{
		Stream: c.stream, Group: c.group, Consumer: w.name, MinIdle: c.cfg.minIdle, Messages: ids,
	}).Result()
	if err != nil {
		if ctx.Err() == nil {
			c.reportError(ctx, cmdErr(CommandClaim, fmt.Errorf("redisstream: XCLAIM %s %s (%d entries): %w", c.stream, ids[0], len(ids), err)))
		}
		// A claim that keeps failing (an ACL without XCLAIM) must not stop
		// the new entries: the next search waits a claim interval.
		w.idle, w.cursor, w.claimAt = nil, "", time.Now().Add(c.cfg.claimInterval)
		return nil
	}
	if len(msgs) == 0 {
		return nil
	}
	for _, f := range c.cfg.onClaim {
		f(ctx, len(msgs))
	}
	out := make([]idemconsume.Message, len(msgs))
	for i, m := range msgs {
		// Still idle, so no one read or claimed it since the search: this
		// is its delivery after the search's count.
		out[i] = message(m, counts[m.ID]+1)
	}
	return out
}

// counted returns msgs, which were delivered before, with their delivery
// counts from XPENDING. A count that cannot be read is 0 (unknown): the
// entry is processed, but not dead-lettered for its deliveries this time.
func (w *worker) counted(ctx context.Context, msgs []redis.XMessage) []idemconsume.Message {
	c := w.c
	counts := make(map[string]int64, len(msgs))
	// One XPENDING for the range of IDs (they come in ID order); entries of
	// this consumer in that range that are not in the batch take room, so
	// leave some, and look up the ones it missed one by one.
	pend, err := c.client.XPendingExt(ctx, &redis.XPendingExtArgs{
		Stream: c.stream, Group: c.group, Consumer: w.name,
		Start: msgs[0].ID, End: msgs[len(msgs)-1].ID, Count: int64(len(msgs)) + 100,
	}).Result()
	if err != nil {
		c.reportError(ctx, cmdErr(CommandPending, fmt.Errorf("redisstream: XPENDING %s: %w", c.stream, err)))
	}
	for _, p := range pend {
		counts[p.ID] = p.RetryCount
	}
	out := make([]idemconsume.Message, 0, len(msgs))
	for _, m := range msgs {
		n, ok := counts[m.ID]
		if !ok && err == nil {
			one, err := c.client.XPendingExt(ctx, &redis.XPendingExtArgs{
				Stream: c.stream, Group: c.group, Consumer: w.name, Start: m.ID, End: m.ID, Count: 1,
			}).Result()
			if err != nil {
				c.reportError(ctx, cmdErr(CommandPending, fmt.Errorf("redisstream: XPENDING %s %s: %w", c.stream, m.ID, err)))
			} else if len(one) == 1 {
				n = one[0].RetryCount
			}
		}
		out = append(out, message(m, n))
	}
	return out
}
