package idemgrpc

import (
	"crypto/rand"
	"encoding/hex"

	"github.com/idemkit/idempotency/idemhttp"
)

// OperationName maps a full gRPC method name to an operation name that
// satisfies coordinator.ValidateOperation, as idemhttp.OperationName maps a
// route pattern: every run of bytes outside [A-Za-z0-9_-] becomes one dot
// and dots at either end are dropped, so "/payments.v1.Payments/Charge"
// becomes "payments.v1.Payments.Charge". A name longer than
// coordinator.MaxOperationLen is cut and ends in "-" and 8 hex digits of the
// SHA-256 of fullMethod. It is the server interceptor's default operation
// name (see WithOperation); use its results in IDEMPOTENCY_OPERATION_TTLS.
func OperationName(fullMethod string) string { return idemhttp.OperationName(fullMethod) }

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
