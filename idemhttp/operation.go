package idemhttp

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"

	"github.com/idemkit/idempotency/coordinator"
)

// OperationName maps s, a ServeMux pattern or a full gRPC method name (the
// default operation of package idemgrpc), to an operation name that
// satisfies coordinator.ValidateOperation: every run of bytes outside
// [A-Za-z0-9_-] (dots, slashes, spaces, braces) becomes one dot, and dots at
// either end are dropped. So "POST /payments/{id}" becomes
// "POST.payments.id", "POST /files/{path...}" "POST.files.path" and
// "POST /{$}" "POST", "/payments.v1.Payments/Charge"
// "payments.v1.Payments.Charge". A name longer than coordinator.MaxOperationLen is cut
// and ends in "-" and 8 hex digits of the SHA-256 of s, so it stays distinct.
// OperationName returns "" when s has no letter, digit, "_" or "-".
//
// Distinct patterns can map to one name ("/a/b" and "/a.b"); their requests
// then share a key space, and the fingerprint, which includes the path, turns
// a key reused across them into a 422 rather than a wrong replay.
func OperationName(s string) string {
	var b strings.Builder
	sep := false
	for i := 0; i < len(s); i++ {
		c := s[i]
		if 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '_' || c == '-' {
			if sep && b.Len() > 0 {
				b.WriteByte('.')
			}
			sep = false
			b.WriteByte(c)
			continue
		}
		sep = true
	}
	name := b.String()
	if len(name) > coordinator.MaxOperationLen {
		sum := sha256.Sum256([]byte(s))
		suffix := "-" + hex.EncodeToString(sum[:4])
		name = strings.TrimRight(name[:coordinator.MaxOperationLen-len(suffix)], ".") + suffix
	}
	return name
}
