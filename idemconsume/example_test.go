package idemconsume_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/idemkit/idempotency/coordinator"
	"github.com/idemkit/idempotency/coordinator/memstore"
	"github.com/idemkit/idempotency/idemconsume"
)

func Example() {
	// In production the store is redisrepo.New(redisClient); memstore keeps
	// this example self-contained.
	c, _ := coordinator.New(memstore.New())
	p, _ := idemconsume.New(c, "billing.credit")

	balance := 0
	credit := func(ctx context.Context, m idemconsume.Message) error {
		amount, err := strconv.Atoi(m.Fields["amount"])
		if err != nil {
			return idemconsume.Permanent(err) // no redelivery can fix it
		}
		balance += amount
		return nil
	}

	// The broker delivers the first message twice (its ack was lost), and the
	// producer published it twice (same idempotency key, new ID).
	deliveries := []idemconsume.Message{
		{ID: "1-0", Fields: map[string]string{"idempotency-key": "order-7", "amount": "5"}, Deliveries: 1},
		{ID: "1-0", Fields: map[string]string{"idempotency-key": "order-7", "amount": "5"}, Deliveries: 2},
		{ID: "2-0", Fields: map[string]string{"idempotency-key": "order-7", "amount": "5"}, Deliveries: 1},
		{ID: "3-0", Fields: map[string]string{"idempotency-key": "order-8", "amount": "five"}, Deliveries: 1},
	}
	for _, m := range deliveries {
		d := p.Process(context.Background(), m, credit)
		fmt.Println(m.ID, d)
	}
	fmt.Println("balance:", balance)
	// Output:
	// 1-0 ack (processed)
	// 1-0 ack (duplicate)
	// 2-0 ack (duplicate)
	// 3-0 dead_letter (permanent_error)
	// balance: 5
}

// A broker adapter acts on the decision after Process has returned: the
// acknowledgement comes after the effect.
func ExampleProcessor_Process() {
	c, _ := coordinator.New(memstore.New())
	p, _ := idemconsume.New(c, "email.send", idemconsume.WithMaxDeliveries(2))
	send := func(context.Context, idemconsume.Message) error { return errors.New("smtp: 421 try again later") }

	for n := int64(1); n <= 2; n++ {
		m := idemconsume.Message{ID: "msg-1", Deliveries: n}
		switch d := p.Process(context.Background(), m, send); d.Action {
		case idemconsume.Ack:
			fmt.Println("ack")
		case idemconsume.Retry:
			fmt.Printf("leave for redelivery: %s: %v\n", d.Reason, d.Err)
		case idemconsume.DeadLetter:
			fmt.Printf("dead-letter: %s: %v\n", d.Reason, d.Err)
		}
	}
	// Output:
	// leave for redelivery: handler_error: smtp: 421 try again later
	// dead-letter: max_deliveries: smtp: 421 try again later
}

// A message delivered more than MaxDeliveries times without being completed
// (its handler kills the consumer every time) is dead-lettered without
// running the handler; one that was completed is acknowledged.
func ExampleWithMaxDeliveries() {
	c, _ := coordinator.New(memstore.New())
	p, _ := idemconsume.New(c, "report.render", idemconsume.WithMaxDeliveries(3))
	render := func(context.Context, idemconsume.Message) error { fmt.Println("rendering"); return nil }

	d := p.Process(context.Background(), idemconsume.Message{ID: "r-1", Deliveries: 4}, render)
	fmt.Println(d, errors.Is(d.Err, idemconsume.ErrMaxDeliveries))
	// Output: dead_letter (max_deliveries) true
}

// The key function decides which deliveries are one message.
func ExampleKeyFromField() {
	c, _ := coordinator.New(memstore.New())
	p, _ := idemconsume.New(c, "order.ship", idemconsume.WithKey(idemconsume.KeyFromField("order-id")))
	ship := func(context.Context, idemconsume.Message) error { return nil }

	d := p.Process(context.Background(), idemconsume.Message{ID: "1-0", Deliveries: 1}, ship)
	fmt.Println(d, errors.Is(d.Err, idemconsume.ErrNoKey))
	d = p.Process(context.Background(), idemconsume.Message{ID: "2-0", Fields: map[string]string{"order-id": "o-9"}, Deliveries: 1}, ship)
	fmt.Println(d, d.Key)
	// Output:
	// dead_letter (bad_message) true
	// ack (processed) o-9
}

// A fingerprint of the content makes a key reused for another message a
// dead letter instead of a duplicate.
func ExampleWithFingerprint() {
	c, _ := coordinator.New(memstore.New())
	p, _ := idemconsume.New(c, "billing.credit", idemconsume.WithFingerprint(func(m idemconsume.Message) (string, error) {
		return coordinator.Fingerprint(m.Fields["account"], m.Fields["amount"])
	}))
	credit := func(context.Context, idemconsume.Message) error { return nil }
	first := idemconsume.Message{ID: "1-0", Fields: map[string]string{"idempotency-key": "k-1", "account": "a", "amount": "5"}, Deliveries: 1}
	other := idemconsume.Message{ID: "2-0", Fields: map[string]string{"idempotency-key": "k-1", "account": "a", "amount": "500"}, Deliveries: 1}
	fmt.Println(p.Process(context.Background(), first, credit))
	fmt.Println(p.Process(context.Background(), other, credit))
	// Output:
	// ack (processed)
	// dead_letter (key_reuse)
}

func ExamplePermanent() {
	err := idemconsume.Permanent(fmt.Errorf("account %q does not exist", "acct-0"))
	fmt.Println(errors.Is(err, idemconsume.ErrPermanent), err)
	// Output: true account "acct-0" does not exist
}
