package idemconsume_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/idemkit/idempotency/coordinator"
	"github.com/idemkit/idempotency/idemconsume"
)

// An invalid option makes New return an error naming the option and the
// value, as a *coordinator.OptionError; a nil option is skipped.
func TestOptionsRule(t *testing.T) {
	c := newCoordinator(t, nil)
	_, err := idemconsume.New(c, "op", idemconsume.WithMaxDeliveries(0), idemconsume.WithTTL(-1))
	var oe *coordinator.OptionError
	if !errors.As(err, &oe) || !strings.HasPrefix(err.Error(), "idemconsume: invalid options: WithMaxDeliveries: must be at least 1, got 0") ||
		!strings.Contains(err.Error(), "WithTTL: must not be negative, got -1ns") {
		t.Fatalf("err = %v; want both refusals, as *coordinator.OptionError", err)
	}
	p, err := idemconsume.New(c, "op", nil, idemconsume.WithMaxDeliveries(2), nil)
	if err != nil || p == nil {
		t.Fatalf("New with nil options = %v, %v; want them skipped", p, err)
	}
}
