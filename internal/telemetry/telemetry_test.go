package telemetry_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/idemkit/idempotency/coordinator/idemstore"
	"github.com/idemkit/idempotency/internal/telemetry"
)

// Redact hides a key in each form a message spells it: raw, quoted (%q),
// inside a quoted "operation:key", and inside a Redis key name, also when
// the key has a quote or a backslash, which %q escapes.
func TestRedact(t *testing.T) {
	for _, key := range []string{"order-12345678", `order"12345678`, `ord\er-12345678`, `a"b`, "abc"} {
		k := idemstore.Key{Operation: "payment.charge", Key: key}
		for _, msg := range []string{
			fmt.Sprintf("key %q of operation %q is in progress", key, k.Operation),
			fmt.Sprintf("%q", k.Operation+":"+key),
			"EVALSHA on idem:" + k.Operation + ":" + key + " failed",
		} {
			got := telemetry.Redact(msg, k, telemetry.OmittedKey)
			if strings.Contains(got, key) || strings.Contains(got, strings.Trim(fmt.Sprintf("%q", key), `"`)) {
				t.Errorf("Redact(%q) = %q: the key %q shows", msg, got, key)
			}
			if !strings.Contains(got, telemetry.OmittedKey) {
				t.Errorf("Redact(%q) = %q: no %s in its place", msg, got, telemetry.OmittedKey)
			}
		}
	}
}
