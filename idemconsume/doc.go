// Package idemconsume processes queue messages at most once per idempotency
// key under at-least-once delivery, over a coordinator.Coordinator, and
// tells the broker adapter what to do with each delivery: acknowledge it,
// leave it for a later redelivery, or dead-letter it. It knows no broker;
// package redisstream is its Redis Streams consumer.
//
//	c, _ := coordinator.New(redisrepo.New(rdb))
//	p, _ := idemconsume.New(c, "billing.credit", idemconsume.WithMaxDeliveries(5))
//	d := p.Process(ctx, idemconsume.Message{ID: id, Fields: fields, Deliveries: n}, credit)
//	switch d.Action {
//	case idemconsume.Ack:        // acknowledge the message
//	case idemconsume.Retry:      // leave it unacknowledged
//	case idemconsume.DeadLetter: // move it to the dead-letter queue, then acknowledge it
//	}
//
// # Keys
//
// The key says which deliveries are the same message. By default
// (KeyFromFieldOrID(DefaultKeyField)) it is the message's "idempotency-key"
// field (a header, attribute or stream field the producer sets), else the
// broker's message ID. The ID is the right key for redelivery: a broker
// redelivers a message under its ID. It is the wrong key when the producer
// may publish one logical message twice (a producer that retries a publish
// whose reply it lost, an outbox relay that restarts): each copy gets an ID
// of its own, and both are processed. Such producers set the field, from the
// business identity of the message ("order-42-refund"). WithKey takes any
// other KeyFunc; a message without a key is dead-lettered, never processed
// unprotected.
//
// # Decisions
//
//	what happened                                 Action      Reason
//	handler ran and succeeded                     Ack         processed
//	handler ran unprotected (store down, "run")   Ack         unprotected
//	done before: redelivery, producer's copy      Ack         duplicate
//	another consumer holds the key                Retry       in_progress (RetryAfter)
//	store down before the handler, mode "raise"   Retry       storage_error
//	store refused the call (any mode)             Retry       storage_error (handler not run)
//	handler succeeded, the commit failed (idempg) Retry       storage_error
//	context ended (the consumer stops)            Retry       canceled
//	handler failed after its reservation was lost Retry       lease_lost
//	handler error (or panic), delivery < max      Retry       handler_error
//	TTL refused by the coordinator's bounds       Retry       invalid_request
//	handler error matching ErrPermanent           DeadLetter  permanent_error
//	handler error on delivery max                 DeadLetter  max_deliveries
//	delivered more than max times, not completed  DeadLetter  max_deliveries (handler not run)
//	the same, but the store cannot say            Retry       storage_error (handler not run)
//	no key, or a key or fingerprint refused       DeadLetter  bad_message
//	(or the key or fingerprint function panicked)
//	key used for a message with another content   DeadLetter  key_reuse
//
// A handler error releases the key (the coordinator stores no failure), so
// the next delivery runs the handler again. A Retry is not a failure: an
// adapter should not count in_progress, storage_error or canceled as
// handler errors, nor back off as from one.
//
// # Ordering, and the window that remains
//
// The adapter acknowledges after Process has returned, so after the effect
// and after the coordinator completed the key's record. A consumer that
// dies between the completion and the acknowledgement leaves the message to
// be redelivered: the redelivery finds the completed record and is
// acknowledged without a second effect. That is the point of the package.
//
// A consumer that dies after its handler made the effect but before the
// record was completed leaves a reservation that expires after the lease;
// the redelivery then runs the handler again. The coordinator cannot close
// that window for an effect outside its store: make the effect itself
// conditional on the key (a unique constraint or a conditional write in the
// same transaction, a Lua script or MULTI in the same Redis), or pass the
// key downstream to a service that deduplicates. docs/consumers.md has
// the details.
//
// The coordinator's modes apply: in-flight mode "wait" (the default) makes a
// consumer that meets a key in progress wait for its result, then
// acknowledge; "raise" returns Retry at once, freeing the consumer. Mode
// "run" takes no reservation, so two consumers may both run a message: do
// not use it for consumers. On-storage-error mode "run" processes messages
// unprotected while the store is down; "raise" leaves them unacknowledged.
package idemconsume
