// Package idemwatermill runs a Watermill handler at most once per
// idempotency key under at-least-once delivery, with any broker Watermill
// consumes from (Kafka, NATS JetStream, AMQP, SQS, Redis Streams, SQL...): a
// message.HandlerMiddleware over an idemconsume.Processor, whose records
// live in the coordinator's store (Redis, through redisrepo).
//
//	c, _ := coordinator.New(redisrepo.New(rdb))
//	p, _ := idemconsume.New(c, "billing.credit", idemconsume.WithMaxDeliveries(5))
//	dedup, _ := idemwatermill.New(p)
//	router.AddConsumerHandler("credit", "orders", sub, credit).AddMiddleware(dedup.Middleware)
//
// # Unlike middleware.Deduplicator
//
// Watermill's own middleware.Deduplicator marks a message as seen before its
// handler runs: a message whose handler failed, or whose consumer died while
// handling it, is dropped when the broker delivers it again. Its default
// store is a map in the process, so two consumers (or one that restarted)
// do not share it. Deduplicator here takes the key's reservation before the
// handler runs (a second consumer that gets the same message meanwhile
// waits for it or is nacked, as the coordinator's in-flight mode says),
// marks the key done only when the handler returned nil, and releases it
// when the handler failed, so that the redelivery runs the handler again.
//
// # What the router does
//
// The handler's nil error acknowledges the message (after the coordinator
// completed the key's record: a consumer that dies in between leaves a
// redelivery that is acknowledged without running the handler). A delivery
// of a key already done is acknowledged without running the handler. Every
// other decision is returned as a *DecisionError, which the router nacks:
// the message comes back. A DeadLetter decision also matches ErrDeadLetter;
// route those to Watermill's poison queue, outermost:
//
//	poison, _ := middleware.PoisonQueueWithFilter(pub, "orders.poison", idemwatermill.IsDeadLetter)
//	router.AddMiddleware(poison, dedup.Middleware, middleware.Retry{
//		MaxRetries: 3, InitialInterval: 100 * time.Millisecond,
//		ShouldRetry: func(p middleware.RetryParams) bool { return !errors.Is(p.Err, idemconsume.ErrPermanent) },
//	}.Middleware)
//
// The poison queue publishes the dead letter (with its reason in the
// "reason_poisoned" metadata field) and acknowledges it; every other error
// is still nacked. middleware.Retry inside Deduplicator retries the handler
// in the process, under the key's reservation, before idemconsume decides;
// outside it, each retry is a new Process call and the reservation is let
// go in between. A plain middleware.PoisonQueue (no filter) would poison
// every error, a Retry decision for a key in progress or a store outage
// included: use the filter.
//
// # Batches
//
// Deduplicator.HandleBatch processes a batch of deliveries that you
// collected yourself (from a subscriber's channel, or a broker's batch
// read) through idemconsume.Processor.ProcessBatch: their keys are
// reserved or read in one store round trip and their records completed
// together, and it returns, per delivery, what Middleware's handler would.
// A router hands a handler one message at a time, and many subscribers
// (NATS JetStream's among them) deliver the next message only once the
// last is acknowledged, so batches are for a consumer loop of your own over
// a subscriber that lets several messages be in flight.
//
// # Delivery counts
//
// idemconsume dead-letters a message whose handler failed on its
// MaxDeliveries'th delivery, and one delivered more times without running
// it (a message that kills its consumer every time). Watermill's message
// has no delivery count: WithDeliveries or WithDeliveriesFromMetadata says
// where the broker's subscriber puts it. Without one every delivery counts
// as unknown, and only a permanent error dead-letters a message.
//
// # Produced messages
//
// The messages a handler returns are published by the router after the
// middleware returned, so after the key's record was completed, and are
// returned only by the delivery that ran the handler: a replay returns none.
// A publish that fails nacks the message, and its redelivery is a replay:
// the produced messages are lost, as they are when the consumer dies between
// the completion and the publish. Handlers whose output must not be lost
// publish it themselves inside the handler (a failed publish then fails the
// handler, and the message is retried; give the output a UUID derived from
// the input's so that its consumers deduplicate a second publish), or write
// it to an outbox in the same transaction as their effect (Watermill's
// forwarder component).
//
// # Ordering, and the window that remains
//
// As with every idemconsume adapter: a consumer that dies after the
// handler's effect but before the coordinator completed the record leaves a
// reservation that expires after the lease; the redelivery then runs the
// handler again. Make the effect conditional on the key
// (coordinator.ReservationFromContext(msg.Context()) gives it to the
// handler) to close that window. docs/consumers.md has the details.
package idemwatermill
