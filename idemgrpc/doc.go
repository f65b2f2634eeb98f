// Package idemgrpc is the gRPC adapter of idemkit: a unary server
// interceptor that runs a handler at most once per idempotency key, through a
// coordinator.Coordinator, and replays the stored outcome to every retry;
// and a unary client interceptor that gives each call one key and keeps it
// across the call's retries.
//
//	c, _ := coordinator.New(store)
//	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(
//		authenticate, // puts the caller in the context
//		idemgrpc.UnaryServerInterceptor(c,
//			idemgrpc.WithMethods("/payments.v1.Payments/Charge"),
//			idemgrpc.WithKeyScope(tenantOf)),
//	))
//
//	conn, _ := grpc.NewClient(target,
//		grpc.WithChainUnaryInterceptor(idemgrpc.UnaryClientInterceptor(
//			idemgrpc.WithMethods("/payments.v1.Payments/Charge"))))
//
// It is a module of its own, github.com/idemkit/idempotency/idemgrpc, so
// that applications of the core module do not get gRPC in their module
// graph.
//
// # Calls
//
// The key is the "idempotency-key" metadata entry (WithKeyHeader): 1 to 255
// visible ASCII characters, used as sent. A call without it passes through
// unprotected unless WithKeyRequired(true). It is stored under an operation
// named after the method ("/payments.v1.Payments/Charge" →
// "payments.v1.Payments.Charge", idemhttp.OperationName; WithOperation) and scoped to
// the caller by WithKeyScope: the stored key is a hash of the scope followed
// by the client's key (idemkey.Scoped), as in idemhttp. The fingerprint is
// the SHA-256 of the full method and the request's deterministic protobuf
// encoding; the same key with another request is refused with
// FailedPrecondition.
//
// # Outcomes
//
// The handler's response is stored as its protobuf encoding and its full
// message name, by which a replay, in any process that links the generated
// code, finds its type in protoregistry.GlobalTypes; a replay returns only
// the method's own response type. A record that cannot be read (corrupt,
// another format, another type) is not replayed: the coordinator runs the
// handler again and replaces it. An error status is
// stored, details included, when the store policy allows
// (DefaultStorePolicy: the codes that describe the request, such as
// InvalidArgument and NotFound, not those that say "try again", such as
// Unavailable and Aborted); otherwise the key is released and a retry runs
// the handler again. An outcome that cannot be stored (larger than the
// coordinator's result limit, a response that is not a registered protobuf
// message) is returned to its caller, but the handler does not run again for
// the key: later calls get AlreadyExists with ReasonNotReplayable. Replays
// carry the response header "idempotent-replayed: true".
//
// # Errors
//
// The server interceptor's refusals carry a google.rpc.ErrorInfo detail
// (ErrorDomain and a Reason constant), and the two that ask to retry a
// google.rpc.RetryInfo and a grpc-retry-pushback-ms trailer:
//
//	InvalidArgument     ReasonKeyMissing, ReasonKeyInvalid
//	Unauthenticated     ReasonCallerUnknown
//	Aborted             ReasonInProgress: the first call with the key still runs
//	FailedPrecondition  ReasonKeyReuse
//	AlreadyExists       ReasonNotReplayable: the key's call ran, but its outcome could not be stored
//	Unavailable         ReasonStoreUnavailable: the store is down and the coordinator fails closed
//
// Whether a concurrent duplicate waits for the first call or is refused at
// once, and whether a store outage refuses calls or runs them unprotected,
// are the coordinator's in-flight and on-storage-error modes.
package idemgrpc
