// Package redisstream consumes a Redis stream in a consumer group and
// processes each entry at most once per idempotency key through an
// idemconsume.Processor.
//
//	p, _ := idemconsume.New(c, "billing.credit")
//	consumer, _ := redisstream.New(rdb, p, "orders", "billing", credit, redisstream.WithWorkers(4))
//	err := consumer.Run(ctx) // until ctx ends
//
// For a lifecycle, Start and Stop run it in the background instead
// (fx.StartStopHook(consumer.Start, consumer.Stop)); in an fx app,
// idempotency.ConsumeStream does all of it, with logs and metrics. The hooks
// WithOnDecision, WithOnError and WithOnClaim add up, and fit the methods of
// an observability.ConsumerObserver.
//
// Run creates the group (XGROUP CREATE ... MKSTREAM) and reads entries with
// XREADGROUP. An entry whose decision is Ack is acknowledged (XACK), after
// its effect; one whose decision is Retry stays pending; one whose decision
// is DeadLetter is added to the dead-letter stream ("<stream>:dead", with
// the FieldDead* fields beside its own) and then acknowledged.
//
// # Redelivery and takeover
//
// Redis Streams redeliver nothing by themselves: an entry that a consumer
// read and never acknowledged stays in the group's pending entries list
// (PEL) under that consumer's name. Each worker, every WithClaimInterval,
// looks for entries that have been pending for WithMinIdle (XPENDING ...
// IDLE), from any consumer (a dead one, or itself after a Retry), claims
// them (XCLAIM) and processes them. Both a claim and a re-read increment
// the entry's delivery counter, which the worker passes as
// Message.Deliveries, so a message that keeps failing, or keeps killing
// its consumer, is dead-lettered after WithMaxDeliveries deliveries. A
// consumer that restarts under its old name (WithConsumerName) takes its
// own pending entries back at once.
//
// A claim or a read charges a delivery to every entry it returns, so a
// message that kills its consumer charges each crash to the batch-mates it
// kept from running too. So that this never dead-letters them, idle
// entries are claimed together only while their deliveries leave room for
// one more such crash and a delivery of their own (at most
// WithMaxDeliveries minus 2), and one at a time after that, each charged
// for itself alone; a consumer's own pending entries are read again one at
// a time.
//
// An entry claimed while its handler still runs elsewhere (a handler slower
// than WithMinIdle) finds its key in progress; keep WithMinIdle above the
// coordinator's lease and a handler's usual run time.
//
// # Keys
//
// With the Processor's default key function, an entry's key is its
// "idempotency-key" field, else its entry ID. The entry ID is the same on
// every redelivery of the entry, so it protects against redelivery; but a
// producer that XADDs one logical message twice (a retried XADD whose reply
// was lost) makes two entries with two IDs, and only a key the producer
// chose (the field) makes them one message.
package redisstream
