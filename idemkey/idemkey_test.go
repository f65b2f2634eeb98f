package idemkey_test

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"
	"testing"

	"github.com/idemkit/idempotency/coordinator"
	"github.com/idemkit/idempotency/idemkey"
)

func TestScoped(t *testing.T) {
	sum := func(s string) string { h := sha256.Sum256([]byte(s)); return hex.EncodeToString(h[:]) }
	long := strings.Repeat("k", coordinator.MaxKeyLen)
	fits := strings.Repeat("k", coordinator.MaxKeyLen-33)
	for _, tc := range []struct{ scope, key, want string }{
		{"shop_1", "order-42", sum("shop_1")[:32] + ":order-42"},
		{"", "order-42", sum("")[:32] + ":order-42"},
		{"alice@example.com", fits, sum("alice@example.com")[:32] + ":" + fits},
		{"alice@example.com", fits + "k", sum("alice@example.com")[:32] + "#" + sum(fits+"k")},
		{"shop_1", long, sum("shop_1")[:32] + "#" + sum(long)},
	} {
		got := idemkey.Scoped(tc.scope, tc.key)
		if got != tc.want {
			t.Errorf("Scoped(%q, %q) = %q, want %q", tc.scope, tc.key, got, tc.want)
		}
		if err := coordinator.ValidateKey(got); err != nil {
			t.Errorf("Scoped(%q, %q) = %q, which ValidateKey refuses: %v", tc.scope, tc.key, got, err)
		}
		if strings.Contains(got, tc.scope) && tc.scope != "" {
			t.Errorf("Scoped(%q, %q) = %q shows the scope", tc.scope, tc.key, got)
		}
	}
	if idemkey.Scoped("tenant:42", "k") == idemkey.Scoped("user:42", "k") {
		t.Error("two scopes share a key")
	}
}
