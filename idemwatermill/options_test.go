package idemwatermill_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/idemkit/idempotency/coordinator"
	"github.com/idemkit/idempotency/idemconsume"
	"github.com/idemkit/idempotency/idemwatermill"
)

func TestNewRefusesANilProcessor(t *testing.T) {
	d, err := idemwatermill.New(nil)
	if err == nil || d != nil {
		t.Fatalf("New(nil) = %v, %v; want no Deduplicator and an error", d, err)
	}
	if !strings.Contains(err.Error(), "processor is nil") {
		t.Errorf("error %q does not say the processor is nil", err)
	}
}

func TestNewRefusesAnEmptyDeliveriesField(t *testing.T) {
	p := newProcessor(t)
	d, err := idemwatermill.New(p, idemwatermill.WithDeliveriesFromMetadata(""))
	if err == nil || d != nil {
		t.Fatalf("New = %v, %v; want no Deduplicator and an error", d, err)
	}
	var oe *coordinator.OptionError
	if !errors.As(err, &oe) || oe.Option != "WithDeliveriesFromMetadata" {
		t.Errorf("error %v is not a *coordinator.OptionError of WithDeliveriesFromMetadata", err)
	}
	// A later WithDeliveries replaces it, and with it the refused value.
	if _, err := idemwatermill.New(p, idemwatermill.WithDeliveriesFromMetadata(""), idemwatermill.WithDeliveries(nil)); err != nil {
		t.Errorf("WithDeliveries after a refused WithDeliveriesFromMetadata: %v", err)
	}
}

func TestNilOptionIsSkipped(t *testing.T) {
	if _, err := idemwatermill.New(newProcessor(t), nil, idemwatermill.WithOnDecision(nil), nil); err != nil {
		t.Fatalf("New with nil options: %v", err)
	}
}

// The delivery count comes from the option that says where it is; without
// one, or with a value that is not a count, it is unknown (0), and a
// message is never dead-lettered for its deliveries.
func TestDeliveries(t *testing.T) {
	tests := []struct {
		name  string
		opt   idemwatermill.Option
		value string // the "deliveries" metadata field; "" for none
		want  int64
	}{
		{"no option", nil, "9", 0},
		{"WithDeliveries(nil)", idemwatermill.WithDeliveries(nil), "9", 0},
		{"WithDeliveries", idemwatermill.WithDeliveries(func(*message.Message) int64 { return 4 }), "", 4},
		{"from metadata", idemwatermill.WithDeliveriesFromMetadata("deliveries"), "7", 7},
		{"from metadata, absent", idemwatermill.WithDeliveriesFromMetadata("deliveries"), "", 0},
		{"from metadata, not a number", idemwatermill.WithDeliveriesFromMetadata("deliveries"), "seven", 0},
		{"from metadata, negative", idemwatermill.WithDeliveriesFromMetadata("deliveries"), "-3", 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// The key function sees the message as idemconsume does.
			var got int64 = -1
			p := newProcessor(t, idemconsume.WithKey(func(m idemconsume.Message) (string, error) {
				got = m.Deliveries
				return m.ID, nil
			}), idemconsume.WithMaxDeliveries(100))
			msg := order("m-1", "")
			if tt.value != "" {
				msg.Metadata.Set("deliveries", tt.value)
			}
			h := newDeduplicator(t, p, tt.opt).Middleware(func(*message.Message) ([]*message.Message, error) { return nil, nil })
			if _, err := h(msg); err != nil {
				t.Fatal(err)
			}
			if got != tt.want {
				t.Errorf("Deliveries = %d, want %d", got, tt.want)
			}
		})
	}
}

// The message idemconsume sees is the Watermill message: its UUID, its
// metadata as the fields, its payload as the body.
func TestMessageAsIdemconsumeSeesIt(t *testing.T) {
	var got idemconsume.Message
	p := newProcessor(t, idemconsume.WithKey(func(m idemconsume.Message) (string, error) {
		got = m
		return m.ID, nil
	}))
	msg := message.NewMessage("m-1", []byte("credit 10"))
	msg.Metadata.Set("account", "acct-7")
	h := newDeduplicator(t, p).Middleware(func(*message.Message) ([]*message.Message, error) { return nil, nil })
	if _, err := h(msg); err != nil {
		t.Fatal(err)
	}
	if got.ID != "m-1" || got.Fields["account"] != "acct-7" || string(got.Body) != "credit 10" || got.Deliveries != 0 {
		t.Errorf("idemconsume saw %+v", got)
	}
}
