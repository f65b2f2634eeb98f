package idemgrpc

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"

	"github.com/idemkit/idempotency/coordinator"
)

// NewKey returns a fresh idempotency key: a random (version 4) UUID from
// crypto/rand, such as "1b4e28ba-2fa1-4d3b-883f-0016d3cca427". The client
// interceptor attaches one to each call that has no key; call NewKey
// yourself, once per logical request, when your own code retries the call
// (see ContextWithKey).
func NewKey() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never returns an error
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	var s [36]byte
	hex.Encode(s[0:8], b[0:4])
	s[8] = '-'
	hex.Encode(s[9:13], b[4:6])
	s[13] = '-'
	hex.Encode(s[14:18], b[6:8])
	s[18] = '-'
	hex.Encode(s[19:23], b[8:10])
	s[23] = '-'
	hex.Encode(s[24:], b[10:])
	return string(s[:])
}

// scopeHashLen is the length of the scope's hash in a scoped key: 32 hex
// digits, 128 bits.
const scopeHashLen = 32

// scopedKey derives the key the coordinator sees from the caller's scope and
// the client's key, exactly as idemhttp does: the first 128 bits of
// SHA-256(scope) in hex, then ":" and the client's key, or, when that would
// pass coordinator.MaxKeyLen, "#" and the SHA-256 of the client's key in
// hex. The scope itself never reaches the store or the logs.
func scopedKey(scope, key string) string {
	s := sha256.Sum256([]byte(scope))
	prefix := hex.EncodeToString(s[:scopeHashLen/2])
	if len(prefix)+1+len(key) <= coordinator.MaxKeyLen {
		return prefix + ":" + key
	}
	k := sha256.Sum256([]byte(key))
	return prefix + "#" + hex.EncodeToString(k[:])
}
