// Package idemconnect is the Connect (connectrpc.com/connect) adapter of
// idemkit: a handler interceptor that runs a unary handler at most once per
// idempotency key, through a coordinator.Coordinator, and replays the stored
// outcome to every retry; and a client interceptor that gives each call one
// key, which the caller keeps across its retries. Both speak the contract of
// idemgrpc, over all three of Connect's protocols (Connect, gRPC and
// gRPC-Web).
//
//	c, _ := coordinator.New(store)
//	idem, err := idemconnect.NewInterceptor(c,
//		idemconnect.WithProcedures(paymentsv1connect.PaymentsChargeProcedure),
//		idemconnect.WithKeyScope(tenantOf))
//	if err != nil { ... }
//	mux := http.NewServeMux()
//	mux.Handle(paymentsv1connect.NewPaymentsHandler(svc, connect.WithInterceptors(idem)))
//
//	ci, err := idemconnect.NewClientInterceptor(
//		idemconnect.WithProcedures(paymentsv1connect.PaymentsChargeProcedure))
//	if err != nil { ... }
//	client := paymentsv1connect.NewPaymentsClient(http.DefaultClient, url, connect.WithInterceptors(ci))
//
// It is a module of its own, github.com/idemkit/idempotency/idemconnect, so
// that applications of the core module do not get Connect in their module
// graph; it does not depend on gRPC either.
//
// # Calls
//
// The key is the "Idempotency-Key" request header (WithKeyHeader): 1 to 255
// visible ASCII characters, used as sent. A call without it passes through
// unprotected unless WithKeyRequired(true). It is stored under an operation
// named after the procedure ("/payments.v1.Payments/Charge" →
// "payments.v1.Payments.Charge", idemhttp.OperationName; WithOperation) and
// scoped to the caller by WithKeyScope: the stored key is a hash of the
// scope followed by the client's key (idemkey.Scoped), as in idemhttp and
// idemgrpc. The fingerprint is the SHA-256 of the procedure and the
// request's deterministic protobuf encoding, whatever codec (binary or
// JSON) carried it; the same key with another request is refused with
// FailedPrecondition.
//
// # Outcomes
//
// Outcomes are stored as idemgrpc stores them: the response as its protobuf
// encoding and its full message name, by which a replay, in any process
// that links the generated code, finds its type in
// protoregistry.GlobalTypes; an error as a google.rpc.Status with its code,
// message and details. A service can therefore move between grpc-go and
// connect-go, or serve a procedure through both, and each replays the
// other's records. A replay returns only the procedure's own response type
// (known from the handler's schema, which generated code passes). A record
// that cannot be read (corrupt, another format, another type) is not
// replayed: the coordinator runs the handler again and replaces it. An
// error is stored when the store policy allows (DefaultStorePolicy: the
// codes that describe the request, such as InvalidArgument and NotFound, not
// those that say "try again", such as Unavailable and Aborted); otherwise
// the key is released and a retry runs the handler again. An outcome that
// cannot be stored (larger than the coordinator's result limit, a response
// that is not a registered protobuf message) is returned to its caller, but
// the handler does not run again for the key: later calls get AlreadyExists
// with ReasonNotReplayable. Replays carry the response header
// "Idempotent-Replayed: true". A replayed response is not a
// *connect.Response of the generated type (an interceptor cannot make one);
// its Any method returns the stored message, of that type.
//
// # Errors
//
// The handler interceptor's refusals are *connect.Error values with a
// google.rpc.ErrorInfo detail (ErrorDomain and a Reason constant), and the
// two that ask to retry a google.rpc.RetryInfo (and, over gRPC, a
// grpc-retry-pushback-ms trailer):
//
//	InvalidArgument     ReasonKeyMissing, ReasonKeyInvalid
//	Unauthenticated     ReasonCallerUnknown
//	Aborted             ReasonInProgress: the first call with the key still runs
//	FailedPrecondition  ReasonKeyReuse
//	AlreadyExists       ReasonNotReplayable: the key's call ran, but its outcome could not be stored
//	Unavailable         ReasonStoreUnavailable: the store is down and the coordinator fails closed
//	Unimplemented       ReasonStreamingUnsupported: a streaming call with a key
//
// Whether a concurrent duplicate waits for the first call or is refused at
// once, and whether a store outage refuses calls or runs them unprotected,
// are the coordinator's in-flight and on-storage-error modes.
package idemconnect
