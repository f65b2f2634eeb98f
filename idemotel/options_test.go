package idemotel_test

import (
	"testing"

	"github.com/idemkit/idempotency/coordinator/idemevent"

	"github.com/idemkit/idempotency/idemotel"
)

// A nil option is skipped, and the options around it still apply
// (docs/user-guide.md, "Options"); idemotel has no option value to refuse.
func TestNewSkipsNilOptions(t *testing.T) {
	tp, sr := newProvider(t)
	ctx, span := startSpan(t, tp)
	o := idemotel.New(nil, idemotel.WithKeyHash(false), nil)
	o.Observe(ctx, idemevent.Event{Kind: idemevent.Miss, Key: k})
	span.End()
	s := ended(t, sr, "request")
	if h, ok := attrs(s.Attributes())["idempotency.key_hash"]; ok {
		t.Fatalf("idempotency.key_hash = %q: WithKeyHash(false) after a nil option was lost", h)
	}
	if idemotel.New(nil) == nil {
		t.Fatal("New(nil) returned nil")
	}
}
