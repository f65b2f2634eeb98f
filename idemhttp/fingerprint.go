package idemhttp

import (
	"net/http"

	"github.com/idemkit/idempotency/internal/wire"
)

// fingerprint returns the lowercase hex SHA-256 over the request's method,
// escaped path, raw query, the configured headers and the body. Each part is
// length-prefixed, so no two different requests share an encoding; the query
// is taken as sent, so reordered parameters are another request.
func fingerprint(r *http.Request, headers []string, body []byte) string {
	h := wire.NewHash("idemhttp/1")
	h.String(r.Method)
	h.String(r.URL.EscapedPath())
	h.String(r.URL.RawQuery)
	for _, name := range headers {
		h.String(name)
		vs := r.Header.Values(name)
		h.Count(len(vs))
		for _, v := range vs {
			h.String(v)
		}
	}
	h.Bytes(body)
	return h.Sum()
}
