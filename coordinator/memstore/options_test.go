package memstore_test

import (
	"testing"
	"time"

	"github.com/idemkit/idempotency/coordinator/memstore"
)

// A nil option is skipped (docs/user-guide.md, "Options"); memstore has no
// option value to refuse.
func TestNewSkipsNilOptions(t *testing.T) {
	clock := memstore.NewFakeClock(time.Unix(1000, 0))
	s := memstore.New(nil, memstore.WithClock(clock.Now), nil)
	if s == nil {
		t.Fatal("New returned nil")
	}
	if s2 := memstore.New(nil); s2 == nil {
		t.Fatal("New(nil) returned nil")
	}
}
