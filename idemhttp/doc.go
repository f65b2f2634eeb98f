// Package idemhttp is net/http middleware that speaks the Idempotency-Key
// header (the IETF httpapi draft, as Stripe uses it): a client that retries a
// POST with the same key gets the first response again instead of a second
// charge.
//
//	c, _ := coordinator.New(store)
//	idem := idemhttp.Middleware(c, idemhttp.WithKeyScope(tenantOf))
//	mux := http.NewServeMux()
//	mux.Handle("POST /payments", idem(http.HandlerFunc(createPayment)))
//
// # Requests
//
// Requests with a method of WithMethods (POST and PATCH by default) and an
// Idempotency-Key header are protected. The key is the header's value, raw
// (abc) or as an RFC 8941 quoted string ("abc", with \" and \\ escapes, and
// optional parameters, which are ignored: "abc";v=1), 1 to 255 visible ASCII
// characters. A request without the header passes through unprotected unless
// WithKeyRequired(true); one with a malformed key or two headers gets 400.
// When the coordinator is disabled (the kill switch), every request passes
// through untouched, whatever its header.
//
// The key is stored under an operation name and scoped to the caller:
//
//   - The operation is WithOperation, else WithOperationFunc, else the ServeMux
//     pattern that matched (http.Request.Pattern) mapped by OperationName
//     ("POST /payments/{id}" → "POST.payments.id"), else DefaultOperation
//     ("http"). The pattern is only known when the middleware wraps the
//     route's handler inside the mux (mux.Handle(pattern, idem(h))), not when
//     it wraps the whole mux.
//   - The scope comes from WithKeyScope (a tenant or user ID). The stored key
//     is a hash of the scope followed by the client's key (idemkey.Scoped), so
//     two callers who send the same key never see each other's response. Without the hook all
//     callers share one key space: set it on any API with more than one
//     client. Callers with equal scopes share one key space too, the empty
//     scope included: return typed scopes ("tenant:42", "user:42").
//
// The request's fingerprint is the SHA-256 of its method, path, query and
// body (read up to WithMaxBodyBytes, 1 MiB, and handed to the handler
// intact), plus the headers of WithFingerprintHeaders. The same key with a
// different fingerprint is refused with 422.
//
// # Responses
//
// The handler runs inside the coordinator with a buffering ResponseWriter.
// Once it returns, its response is stored (status, the allow-listed headers
// of DefaultReplayHeaders or WithReplayHeaders, and the body) and sent to
// the client with every header it set. Later requests with the key get the
// stored response plus "Idempotent-Replayed: true". Set-Cookie, Authorization,
// Proxy-Authorization, Cookie, hop-by-hop headers, Content-Length, Date and
// trailers are never stored, whatever the allow-list says.
//
// The ResponseWriter treats headers as net/http's does. The handler's header
// map starts with the headers middleware outside this one set; what goes out
// is the map as it was when the status was set (by WriteHeader, or the first
// Write or Flush), so later changes are not sent, except the values of
// declared trailers (the Trailer header, http.TrailerPrefix), which follow
// the body. Only what the handler did to the outer headers is stored: values
// it added are added, on a replay, to those outer middleware sets on that
// request, and headers it replaced or removed are replaced or removed. A
// Content-Type is sniffed as net/http sniffs it (not with a Content-Encoding,
// nor when the handler set it to nil).
//
// A response the store policy refuses (DefaultStorePolicy refuses 408,
// 429, 499 and 5xx; see WithStorePolicy) is sent and not stored: it is a failure, and
// failures are not cached, so the key is released and a retry runs the
// handler again. A response that cannot be stored — its body is larger than
// WithMaxResponseBytes (1 MiB), or the handler flushes (streaming) or hijacks
// the connection — is sent too, but the handler's effect happened: the
// coordinator reports record_validation_error and keeps the key as not
// replayable, and every retry gets 409 ProblemNotReplayable; the handler
// never runs twice for the key. A handler that panics has sent nothing unless
// it streamed; the key is released and the panic goes on to net/http.
//
// # Errors
//
// The middleware's own refusals are RFC 9457 problem details
// (application/problem+json, see Problem and WithProblemWriter):
//
//	400 ProblemKeyMissing, ProblemKeyInvalid, ProblemBodyUnreadable
//	401 ProblemCallerUnknown     the scope hook returned an error; WWW-Authenticate of WithAuthChallenge
//	409 ProblemInProgress        the first request still runs; Retry-After
//	409 ProblemNotReplayable     processed, but its response could not be stored; no Retry-After
//	413 ProblemBodyTooLarge
//	422 ProblemKeyReuse
//	503 ProblemStoreUnavailable  the store failed and the coordinator fails closed; Retry-After
//
// Whether a second request waits for the first or gets 409 at once, and
// whether a store outage gives 503 or runs the handler unprotected, are the
// coordinator's in-flight and on-storage-error modes.
//
// # Clients
//
// Transport is the client half: an http.RoundTripper that gives each POST
// and PATCH (WithClientMethods) one key and keeps it across the request's
// retries, waits out 409 in-progress (its Retry-After, up to
// WithInProgressWait) and never retries a 400 or 422. A request keeps the
// Idempotency-Key header it has (SetKey), else takes the key of
// ContextWithKey, else gets a NewKey written into its Header, so that
// sending it again, or a copy of it, carries the same key: a plain retry
// loop and go-retryablehttp alike. Replayed tells a replayed response.
//
//	tr, err := idemhttp.NewTransport(nil)
//	client := &http.Client{Transport: tr, Timeout: 10 * time.Second}
package idemhttp
