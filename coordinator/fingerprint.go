package coordinator

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
)

// Fingerprint returns a request fingerprint for Call.Fingerprint: the
// lowercase hex SHA-256 of the canonical JSON encoding of values, taken as
// one JSON array. Equal inputs give equal fingerprints in every process and on
// every platform.
//
// Canonical means: values are first encoded with encoding/json (so struct
// tags, MarshalJSON and TextMarshaler apply as usual), then re-encoded with
// object members sorted by key (byte order of the UTF-8 key), no whitespace,
// no HTML escaping (<, > and & stay as they are), strings escaped as
// encoding/json escapes them otherwise, and numbers kept exactly as
// encoding/json wrote them (integers in full, floats in their shortest form,
// e.g. 1, 1.5, 1e+21). Map key order and struct field order therefore do not
// matter; a nil slice and an empty one differ (null and []).
//
// Fingerprint what identifies the request (the amount, the account), not what
// varies between retries (timestamps, trace IDs). It returns an error when a
// value cannot be encoded as JSON.
func Fingerprint(values ...any) (string, error) {
	if values == nil {
		values = []any{}
	}
	var raw bytes.Buffer
	enc := json.NewEncoder(&raw)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(values); err != nil {
		return "", fmt.Errorf("idempotency: fingerprint: %w", err)
	}
	dec := json.NewDecoder(&raw)
	dec.UseNumber()
	var generic any
	if err := dec.Decode(&generic); err != nil {
		return "", fmt.Errorf("idempotency: fingerprint: %w", err)
	}
	var canon bytes.Buffer
	enc = json.NewEncoder(&canon)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(generic); err != nil { // maps are written with sorted keys
		return "", fmt.Errorf("idempotency: fingerprint: %w", err)
	}
	sum := sha256.Sum256(bytes.TrimSuffix(canon.Bytes(), []byte("\n")))
	return hex.EncodeToString(sum[:]), nil
}
