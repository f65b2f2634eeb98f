package idemhttp

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"hash"
	"net/http"
)

// fingerprint returns the lowercase hex SHA-256 over the request's method,
// escaped path, raw query, the configured headers and the body. Each part is
// length-prefixed, so no two different requests share an encoding; the query
// is taken as sent, so reordered parameters are another request.
func fingerprint(r *http.Request, headers []string, body []byte) string {
	h := sha256.New()
	field(h, "idemhttp/1")
	field(h, r.Method)
	field(h, r.URL.EscapedPath())
	field(h, r.URL.RawQuery)
	for _, name := range headers {
		field(h, name)
		vs := r.Header.Values(name)
		count(h, len(vs))
		for _, v := range vs {
			field(h, v)
		}
	}
	count(h, len(body))
	h.Write(body)
	return hex.EncodeToString(h.Sum(nil))
}

func field(h hash.Hash, s string) {
	count(h, len(s))
	h.Write([]byte(s))
}

func count(h hash.Hash, n int) {
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], uint64(n))
	h.Write(b[:])
}
