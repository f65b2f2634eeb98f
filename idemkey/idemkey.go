package idemkey

import (
	"crypto/sha256"
	"encoding/hex"

	"github.com/idemkit/idempotency/coordinator"
)

// scopeHashLen is the length of the scope's hash in a scoped key: 32 hex
// digits, 128 bits.
const scopeHashLen = 32

// Scoped returns the key the coordinator sees for the client's key under a
// caller's scope: the first 128 bits of SHA-256(scope) in hex, then ":" and
// key, or, when that would pass coordinator.MaxKeyLen, "#" and the hex
// SHA-256 of key. The result satisfies coordinator.ValidateKey whenever key
// does, and the scope itself (an e-mail address, a tenant name) never
// reaches the store or the logs. Equal scopes share keys; "" is one scope
// like any other.
func Scoped(scope, key string) string {
	s := sha256.Sum256([]byte(scope))
	prefix := hex.EncodeToString(s[:scopeHashLen/2])
	if len(prefix)+1+len(key) <= coordinator.MaxKeyLen {
		return prefix + ":" + key
	}
	k := sha256.Sum256([]byte(key))
	return prefix + "#" + hex.EncodeToString(k[:])
}
