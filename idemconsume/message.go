package idemconsume

import (
	"context"
	"fmt"
)

// DefaultKeyField is the message field (header, attribute, stream field)
// that the default key function reads the idempotency key from.
const DefaultKeyField = "idempotency-key"

// Message is one delivery of a message, as the broker adapter hands it to a
// Processor: what the idempotency layer needs to know about it. The adapter
// closes over its own message type in the Handler when the handler needs
// more.
type Message struct {
	// ID is the broker's identifier of the message, the same on every
	// delivery of it: a Redis stream entry ID, an SQS MessageId, a Kafka
	// topic/partition/offset.
	ID string
	// Fields are the message's named string values: the fields of a stream
	// entry, a message's headers or attributes. The key function reads the
	// key from them.
	Fields map[string]string
	// Body is the message's payload, for brokers that have one; nil for
	// Redis Streams, whose entries are all fields.
	Body []byte
	// Deliveries is how many times the broker has delivered the message,
	// this delivery included (1 on the first). 0 means the broker does not
	// say; such a message is never dead-lettered for its deliveries.
	Deliveries int64
}

// Handler processes one message: it makes the message's effect. It returns
// nil when the effect is made, an error for which Permanent (or a match of
// ErrPermanent) says that no redelivery can succeed, or any other error for
// "try again on a later delivery". Its context is cancelled when the
// consumer stops, and with cause coordinator.ErrLeaseLost when another
// consumer may have taken the message over.
type Handler func(ctx context.Context, msg Message) error

// KeyFunc derives the idempotency key of a message: the string that is the
// same on every delivery of the message and on every copy that a producer
// published of it, and different for every other message. Its error, or its
// panic (recovered as a *PanicError), dead-letters the message
// (ReasonBadMessage): a message without a key can never be processed
// safely.
type KeyFunc func(msg Message) (string, error)

// KeyFromID is the KeyFunc that keys a message by its broker ID: right for
// redeliveries, which carry the same ID, wrong for a producer that publishes
// the same logical message twice, which gets two IDs (see the package
// documentation). It returns ErrNoKey when the ID is empty.
func KeyFromID(msg Message) (string, error) {
	if msg.ID == "" {
		return "", fmt.Errorf("%w: the message has no ID", ErrNoKey)
	}
	return msg.ID, nil
}

// KeyFromField returns a KeyFunc that keys a message by the value of its
// field name (a header or stream field the producer set), and returns
// ErrNoKey for a message without that field or with an empty one.
func KeyFromField(name string) KeyFunc {
	return func(msg Message) (string, error) {
		if v := msg.Fields[name]; v != "" {
			return v, nil
		}
		return "", fmt.Errorf("%w: the message has no %q field", ErrNoKey, name)
	}
}

// KeyFromFieldOrID returns a KeyFunc that keys a message by the value of
// its field name when the message has a non-empty one, and by its ID
// otherwise. KeyFromFieldOrID(DefaultKeyField) is the default key function:
// producers that may publish a message twice set the field; the others get
// protection against redelivery from the ID.
func KeyFromFieldOrID(name string) KeyFunc {
	return func(msg Message) (string, error) {
		if v := msg.Fields[name]; v != "" {
			return v, nil
		}
		return KeyFromID(msg)
	}
}
