package idemwatermill_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"

	"github.com/idemkit/idempotency/coordinator"
	"github.com/idemkit/idempotency/coordinator/memstore"
	"github.com/idemkit/idempotency/idemconsume"
	"github.com/idemkit/idempotency/idemwatermill"
)

// A handler that fails is run again on the redelivery; once it succeeded,
// deliveries of the same key are acknowledged without running it. (A
// memstore stands in for redisrepo.New(rdb), so that the example runs
// without a server.)
func ExampleDeduplicator_Middleware() {
	c, _ := coordinator.New(memstore.New())
	defer c.Close()
	p, _ := idemconsume.New(c, "billing.credit")
	dedup, _ := idemwatermill.New(p)

	failures := 1
	credit := dedup.Middleware(func(msg *message.Message) ([]*message.Message, error) {
		if failures > 0 {
			failures--
			return nil, errors.New("ledger unavailable")
		}
		fmt.Println("credited", msg.Metadata.Get("idempotency-key"))
		return nil, nil
	})

	deliver := func(uuid string) {
		msg := message.NewMessage(uuid, []byte(`{"amount":10}`))
		msg.Metadata.Set("idempotency-key", "order-42")
		if _, err := credit(msg); err != nil {
			fmt.Println("nack:", err)
			return
		}
		fmt.Println("ack", uuid)
	}
	deliver("uuid-1") // the handler fails: nacked, the broker delivers it again
	deliver("uuid-1") // the redelivery runs the handler
	deliver("uuid-1") // a redelivery after a lost ack: not run again
	deliver("uuid-2") // the producer's copy, same key: not run again
	// Output:
	// nack: idemwatermill: retry (handler_error): ledger unavailable
	// credited order-42
	// ack uuid-1
	// ack uuid-1
	// ack uuid-2
}

// A router whose dead letters go to a poison queue: the poison queue
// middleware outermost, filtered with IsDeadLetter, then the Deduplicator.
// Every other error is nacked, and the message redelivered. (A Go channel
// stands in for the broker, a memstore for Redis.)
func Example_router() {
	c, _ := coordinator.New(memstore.New())
	defer c.Close()
	p, _ := idemconsume.New(c, "billing.credit")
	dedup, _ := idemwatermill.New(p)

	logger := watermill.NopLogger{}
	// Publish returns once the message is acknowledged: one at a time.
	pubSub := gochannel.NewGoChannel(gochannel.Config{BlockPublishUntilSubscriberAck: true}, logger)
	defer pubSub.Close()
	poisonQueue := gochannel.NewGoChannel(gochannel.Config{Persistent: true}, logger)
	defer poisonQueue.Close()
	poison, _ := middleware.PoisonQueueWithFilter(poisonQueue, "orders.poison", idemwatermill.IsDeadLetter)

	router, _ := message.NewRouter(message.RouterConfig{}, logger)
	router.AddMiddleware(poison, dedup.Middleware)
	router.AddConsumerHandler("credit", "orders", pubSub, func(msg *message.Message) error {
		if string(msg.Payload) == "not a number" {
			return idemconsume.Permanent(errors.New("amount does not parse"))
		}
		fmt.Println("credited", msg.Metadata.Get("idempotency-key"), string(msg.Payload))
		return nil
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = router.Run(ctx) }()
	<-router.Running()

	dead, _ := poisonQueue.Subscribe(ctx, "orders.poison")
	for i, o := range []struct{ key, amount string }{
		{"order-41", "10"},
		{"order-41", "10"}, // the producer published it twice
		{"order-42", "not a number"},
	} {
		msg := message.NewMessage(fmt.Sprint("uuid-", i), []byte(o.amount))
		msg.Metadata.Set("idempotency-key", o.key)
		_ = pubSub.Publish("orders", msg)
	}
	d := <-dead
	fmt.Println("poisoned", d.Metadata.Get("idempotency-key")+":", d.Metadata.Get(middleware.ReasonForPoisonedKey))
	d.Ack()
	cancel()
	<-done
	// Output:
	// credited order-41 10
	// poisoned order-42: idemwatermill: dead_letter (permanent_error): amount does not parse
}
