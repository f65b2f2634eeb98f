package idemhttp

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"strings"

	"github.com/idemkit/idempotency/coordinator"
)

// The header names the middleware speaks.
const (
	// KeyHeader is the request header that carries the idempotency key.
	KeyHeader = "Idempotency-Key"
	// ReplayedHeader is set to "true" on every replayed response, as Stripe
	// does.
	ReplayedHeader = "Idempotent-Replayed"
)

// parseKey returns the key in an Idempotency-Key header value: an RFC 8941
// sf-string (a quoted string in which only \" and \\ are escapes), or, as
// many clients send it, the raw key. Either way the key must satisfy
// coordinator.ValidateKey, so `"abc"` and abc are the same key.
func parseKey(v string) (string, error) {
	if !strings.HasPrefix(v, `"`) {
		return v, coordinator.ValidateKey(v)
	}
	var b strings.Builder
	for i := 1; i < len(v); i++ {
		switch c := v[i]; {
		case c == '\\':
			i++
			if i == len(v) || v[i] != '"' && v[i] != '\\' {
				return "", errors.New(`a backslash in a quoted key must escape " or \`)
			}
			b.WriteByte(v[i])
		case c == '"':
			if i != len(v)-1 {
				return "", errors.New("the quoted key is followed by more characters")
			}
			k := b.String()
			return k, coordinator.ValidateKey(k)
		case c < 0x20 || c > 0x7e:
			return "", errors.New("a quoted key may contain only printable ASCII")
		default:
			b.WriteByte(c)
		}
	}
	return "", errors.New("the quoted key has no closing quote")
}

// scopeHashLen is the length of the scope's hash in a scoped key: 32 hex
// digits, 128 bits.
const scopeHashLen = 32

// scopedKey derives the key the coordinator sees from the caller's scope and
// the client's key: the first 128 bits of SHA-256(scope) in hex, then ":" and
// the client's key, or, when that would pass coordinator.MaxKeyLen, "#" and
// the SHA-256 of the client's key in hex. The result always satisfies
// coordinator.ValidateKey; the scope itself (an e-mail address, a tenant
// name) never reaches the store or the logs.
func scopedKey(scope, key string) string {
	s := sha256.Sum256([]byte(scope))
	prefix := hex.EncodeToString(s[:scopeHashLen/2])
	if len(prefix)+1+len(key) <= coordinator.MaxKeyLen {
		return prefix + ":" + key
	}
	k := sha256.Sum256([]byte(key))
	return prefix + "#" + hex.EncodeToString(k[:])
}
