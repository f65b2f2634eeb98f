package idemconsume_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

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

func ExampleNew() {
	c, _ := coordinator.New(memstore.New())
	_, err := idemconsume.New(c, "billing credit") // a space: not an operation name
	fmt.Println(err != nil)
	p, err := idemconsume.New(c, "billing.credit", idemconsume.WithMaxDeliveries(10), idemconsume.WithTTL(24*time.Hour))
	fmt.Println(p.Operation(), err)
	// Output:
	// true
	// billing.credit <nil>
}

// Give every consumer group its own operation: its records are its own.
func ExampleProcessor_Operation() {
	c, _ := coordinator.New(memstore.New())
	billing, _ := idemconsume.New(c, "billing.credit")
	email, _ := idemconsume.New(c, "email.receipt")
	m := idemconsume.Message{ID: "1-0", Deliveries: 1}
	handle := func(context.Context, idemconsume.Message) error { return nil }
	fmt.Println(billing.Operation(), billing.Process(context.Background(), m, handle))
	fmt.Println(email.Operation(), email.Process(context.Background(), m, handle))
	// Output:
	// billing.credit ack (processed)
	// email.receipt ack (processed)
}

// Processor is the broker-neutral part of a consumer: one per operation,
// shared by every worker.
func ExampleProcessor() {
	c, _ := coordinator.New(memstore.New())
	p, _ := idemconsume.New(c, "billing.credit")
	credits := 0
	credit := func(context.Context, idemconsume.Message) error { credits++; return nil }
	for range 3 { // the same message, redelivered twice
		p.Process(context.Background(), idemconsume.Message{ID: "1-0", Deliveries: 1}, credit)
	}
	fmt.Println("credits:", credits)
	// Output: credits: 1
}

// Only the ID: every redelivery is one message, but a producer's second
// publish of it is another.
func ExampleKeyFromID() {
	key, err := idemconsume.KeyFromID(idemconsume.Message{ID: "1700000000000-0"})
	fmt.Println(key, err)
	_, err = idemconsume.KeyFromID(idemconsume.Message{})
	fmt.Println(errors.Is(err, idemconsume.ErrNoKey))
	// Output:
	// 1700000000000-0 <nil>
	// true
}

// The default key function: the producer's key when it set one, else the
// broker's ID.
func ExampleKeyFromFieldOrID() {
	key := idemconsume.KeyFromFieldOrID(idemconsume.DefaultKeyField)
	k1, _ := key(idemconsume.Message{ID: "1-0", Fields: map[string]string{"idempotency-key": "order-7"}})
	k2, _ := key(idemconsume.Message{ID: "2-0", Fields: map[string]string{"amount": "5"}})
	fmt.Println(k1, k2)
	// Output: order-7 2-0
}

// Any function of the message is a key function; its error dead-letters the
// message.
func ExampleKeyFunc() {
	var byOrder idemconsume.KeyFunc = func(m idemconsume.Message) (string, error) {
		order, kind := m.Fields["order"], m.Fields["kind"]
		if order == "" || kind == "" {
			return "", fmt.Errorf("%w: no order or kind", idemconsume.ErrNoKey)
		}
		return order + "-" + kind, nil // "order-42-refund"
	}
	key, _ := byOrder(idemconsume.Message{ID: "9-0", Fields: map[string]string{"order": "order-42", "kind": "refund"}})
	fmt.Println(key)
	// Output: order-42-refund
}

func ExampleWithKey() {
	c, _ := coordinator.New(memstore.New())
	p, _ := idemconsume.New(c, "billing.credit", idemconsume.WithKey(idemconsume.KeyFromID))
	credit := func(context.Context, idemconsume.Message) error { return nil }
	// The producer published one order twice: two IDs, so two messages.
	for _, id := range []string{"1-0", "2-0"} {
		m := idemconsume.Message{ID: id, Fields: map[string]string{"idempotency-key": "order-7"}, Deliveries: 1}
		fmt.Println(id, p.Process(context.Background(), m, credit))
	}
	// Output:
	// 1-0 ack (processed)
	// 2-0 ack (processed)
}

// The record of a processed message is kept for the TTL: a copy that comes
// back later than that runs the handler again.
func ExampleWithTTL() {
	c, _ := coordinator.New(memstore.New())
	_, err := idemconsume.New(c, "billing.credit", idemconsume.WithTTL(-time.Hour))
	fmt.Println(err)
	p, _ := idemconsume.New(c, "billing.credit", idemconsume.WithTTL(7*24*time.Hour))
	fmt.Println(p.Process(context.Background(), idemconsume.Message{ID: "1-0", Deliveries: 1},
		func(context.Context, idemconsume.Message) error { return nil }))
	// Output:
	// idemconsume: invalid options: WithTTL: must not be negative, got -1h0m0s
	// ack (processed)
}

// Options are collected like any other value.
func ExampleOption() {
	opts := []idemconsume.Option{idemconsume.WithMaxDeliveries(3)}
	if strict := true; strict {
		opts = append(opts, idemconsume.WithKey(idemconsume.KeyFromField("order-id")))
	}
	c, _ := coordinator.New(memstore.New())
	p, err := idemconsume.New(c, "order.ship", opts...)
	fmt.Println(p != nil, err)
	// Output: true <nil>
}

// A Message is what a broker adapter hands over for one delivery.
func ExampleMessage() {
	c, _ := coordinator.New(memstore.New())
	p, _ := idemconsume.New(c, "billing.credit")
	m := idemconsume.Message{
		ID:         "1700000000000-0",                      // the broker's ID, the same on every delivery
		Fields:     map[string]string{"account": "acct-1"}, // headers, attributes or stream fields
		Body:       []byte(`{"amount":5}`),
		Deliveries: 1, // 0 when the broker does not count
	}
	d := p.Process(context.Background(), m, func(_ context.Context, m idemconsume.Message) error {
		fmt.Printf("credit %s: %s\n", m.Fields["account"], m.Body)
		return nil
	})
	fmt.Println(d, d.Key)
	// Output:
	// credit acct-1: {"amount":5}
	// ack (processed) 1700000000000-0
}

// A Handler makes the effect and says, by its error, whether a redelivery
// could help.
func ExampleHandler() {
	var handle idemconsume.Handler = func(ctx context.Context, m idemconsume.Message) error {
		if _, err := strconv.Atoi(m.Fields["amount"]); err != nil {
			return idemconsume.Permanent(err) // dead-letter: it will never parse
		}
		if m.Fields["account"] == "" {
			return errors.New("account service unavailable") // retry on a later delivery
		}
		return nil
	}
	c, _ := coordinator.New(memstore.New())
	p, _ := idemconsume.New(c, "billing.credit")
	for i, fields := range []map[string]string{{"amount": "x"}, {"amount": "5"}, {"amount": "5", "account": "a"}} {
		fmt.Println(p.Process(context.Background(), idemconsume.Message{ID: strconv.Itoa(i), Fields: fields, Deliveries: 1}, handle))
	}
	// Output:
	// dead_letter (permanent_error)
	// retry (handler_error)
	// ack (processed)
}

// A broker adapter switches on the Action; the Reason is for logs and
// metrics.
func ExampleDecision() {
	c, _ := coordinator.New(memstore.New())
	p, _ := idemconsume.New(c, "billing.credit")
	d := p.Process(context.Background(), idemconsume.Message{ID: "1-0", Deliveries: 1},
		func(context.Context, idemconsume.Message) error { return errors.New("ledger unavailable") })
	fmt.Println(d.Action, d.Reason, d.Key, d.Err, d.RetryAfter)
	// Output: retry handler_error 1-0 ledger unavailable 0s
}

func ExampleDecision_String() {
	d := idemconsume.Decision{Action: idemconsume.DeadLetter, Reason: idemconsume.ReasonKeyReuse}
	fmt.Println(d.String())
	// Output: dead_letter (key_reuse)
}

func ExampleAction_String() {
	for _, a := range []idemconsume.Action{idemconsume.Ack, idemconsume.Retry, idemconsume.DeadLetter, 0} {
		fmt.Println(a.String())
	}
	// Output:
	// ack
	// retry
	// dead_letter
	// Action(0)
}

// Reasons are a small fixed set, fit for a metric label.
func ExampleReason() {
	counts := map[idemconsume.Reason]int{}
	c, _ := coordinator.New(memstore.New())
	p, _ := idemconsume.New(c, "billing.credit")
	credit := func(context.Context, idemconsume.Message) error { return nil }
	for _, id := range []string{"1-0", "1-0", "2-0"} {
		counts[p.Process(context.Background(), idemconsume.Message{ID: id, Deliveries: 1}, credit).Reason]++
	}
	fmt.Println(counts[idemconsume.ReasonProcessed], counts[idemconsume.ReasonDuplicate])
	// Output: 2 1
}

// A handler that panics does not take the consumer down: its panic is the
// decision's error.
func ExamplePanicError() {
	c, _ := coordinator.New(memstore.New())
	p, _ := idemconsume.New(c, "billing.credit")
	d := p.Process(context.Background(), idemconsume.Message{ID: "1-0", Deliveries: 1},
		func(context.Context, idemconsume.Message) error { panic("nil map") })
	var pe *idemconsume.PanicError
	fmt.Println(d, errors.As(d.Err, &pe), pe.Value, len(pe.Stack) > 0)
	// Output: retry (handler_error) true nil map true
}

func ExamplePanicError_Error() {
	err := &idemconsume.PanicError{Value: "nil map"}
	fmt.Println(err.Error())
	// Output: idemconsume: handler panicked: nil map
}

// A handler that panics with an error still matches it.
func ExamplePanicError_Unwrap() {
	err := &idemconsume.PanicError{Value: idemconsume.Permanent(errors.New("bad order"))}
	fmt.Println(errors.Is(err, idemconsume.ErrPermanent), err.Unwrap())
	// Output: true bad order
}
