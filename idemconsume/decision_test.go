package idemconsume_test

import (
	"testing"

	"github.com/idemkit/idempotency/idemconsume"
)

func TestReasonsAndTheirActions(t *testing.T) {
	want := map[idemconsume.Reason]idemconsume.Action{
		idemconsume.ReasonProcessed: idemconsume.Ack, idemconsume.ReasonUnprotected: idemconsume.Ack, idemconsume.ReasonDuplicate: idemconsume.Ack,
		idemconsume.ReasonInProgress: idemconsume.Retry, idemconsume.ReasonLeaseLost: idemconsume.Retry, idemconsume.ReasonStorage: idemconsume.Retry,
		idemconsume.ReasonCanceled: idemconsume.Retry, idemconsume.ReasonHandlerError: idemconsume.Retry, idemconsume.ReasonInvalidRequest: idemconsume.Retry,
		idemconsume.ReasonPermanent: idemconsume.DeadLetter, idemconsume.ReasonMaxDeliveries: idemconsume.DeadLetter,
		idemconsume.ReasonBadMessage: idemconsume.DeadLetter, idemconsume.ReasonKeyReuse: idemconsume.DeadLetter,
	}
	got := idemconsume.Reasons()
	if len(got) != len(want) {
		t.Fatalf("Reasons() = %v, want the %d reasons", got, len(want))
	}
	for _, r := range got {
		if a, ok := want[r]; !ok || r.Action() != a {
			t.Errorf("%s.Action() = %v, want %v (listed: %v)", r, r.Action(), a, ok)
		}
	}
	if a := idemconsume.Reason("other").Action(); a != 0 {
		t.Errorf("an unknown reason's Action() = %v, want 0", a)
	}
	if idemconsume.ReasonCanceled != "canceled" {
		t.Errorf("ReasonCanceled = %q, spelt as the coordinator's canceled", idemconsume.ReasonCanceled)
	}
}
