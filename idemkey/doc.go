// Package idemkey derives the key under which idemhttp and idemgrpc store a
// scoped caller's idempotency key, so that one tenant can never replay
// another's response.
//
// Both adapters call Scoped with the scope their WithKeyScope hook returned
// and the key the client sent; the coordinator, Redis and the logs see only
// the result. Call it yourself to find a scoped record, as
// `idemctl lookup -scope` does:
//
//	key := idemkey.Scoped("shop_1", "order-42")
//	// "<32 hex digits of SHA-256("shop_1")>:order-42", stored in Redis as
//	// "idempotency:POST.payments:" + key
package idemkey
