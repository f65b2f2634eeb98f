package coordinator

// Limits on the parts of a Call.
const (
	// MaxKeyLen is the longest idempotency key, in bytes.
	MaxKeyLen = 255
	// MaxOperationLen is the longest operation name, in bytes.
	MaxOperationLen = 100
	// MaxFingerprintLen is the longest fingerprint, in bytes.
	MaxFingerprintLen = 512
)

// ValidateKey returns an *InvalidRequestError unless key is 1 to
// MaxKeyLen bytes of visible ASCII (0x21 to 0x7E). Nothing is stripped or
// normalised: the key is used exactly as given.
func ValidateKey(key string) error {
	if key == "" {
		return invalid("key is empty")
	}
	return visibleASCII("key", key, MaxKeyLen)
}

// ValidateOperation returns an *InvalidRequestError unless op is
// 1 to MaxOperationLen bytes of [A-Za-z0-9._-].
func ValidateOperation(op string) error {
	if op == "" {
		return invalid("operation is empty")
	}
	if len(op) > MaxOperationLen {
		return invalid("operation is %d bytes, longer than %d", len(op), MaxOperationLen)
	}
	for i := 0; i < len(op); i++ {
		c := op[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '.' || c == '_' || c == '-') {
			return invalid("operation %q has byte 0x%02x at offset %d; only [A-Za-z0-9._-] is allowed", op, c, i)
		}
	}
	return nil
}

// ValidateFingerprint returns an *InvalidRequestError unless fp is "" (no
// fingerprint) or 1 to MaxFingerprintLen bytes of visible ASCII (0x21 to
// 0x7E): what Do checks of Call.Fingerprint, for an adapter that computes a
// fingerprint and wants to tell its own bad one from the caller's.
func ValidateFingerprint(fp string) error {
	return visibleASCII("fingerprint", fp, MaxFingerprintLen)
}

// visibleASCII returns an error matching ErrInvalidRequest, naming what s
// is, unless s is at most maxLen bytes of visible ASCII (0x21 to 0x7E).
func visibleASCII(what, s string, maxLen int) error {
	if len(s) > maxLen {
		return invalid("%s is %d bytes, longer than %d", what, len(s), maxLen)
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x21 || c > 0x7e {
			return invalid("%s has byte 0x%02x at offset %d; only visible ASCII (0x21-0x7e) is allowed", what, c, i)
		}
	}
	return nil
}
