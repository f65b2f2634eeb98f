package idemgrpc

import "github.com/idemkit/idempotency/idemhttp"

// NewKey returns a fresh idempotency key: a random (version 4) UUID from
// crypto/rand, such as "1b4e28ba-2fa1-4d3b-883f-0016d3cca427". The client
// interceptor attaches one to each call that has no key; call NewKey
// yourself, once per logical request, when your own code retries the call
// (see ContextWithKey).
func NewKey() string { return idemhttp.NewKey() }
