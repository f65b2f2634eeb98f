// Package protorpc is the contract that the protobuf RPC adapters, idemgrpc
// (grpc-go) and idemconnect (connectrpc.com/connect), share: how a call's
// idempotency key is read and refused, how its request is fingerprinted,
// how its outcome is stored and read back, which outcomes are stored, and
// which status, ErrorInfo reason and RetryInfo each refusal of the
// coordinator becomes.
//
// It imports neither gRPC nor Connect, only google.golang.org/protobuf:
// codes are numbers (Connect's codes have gRPC's numbers), and the
// google.rpc.Status of a stored error is a message that the adapter makes
// (Codec.NewStatus), so that this module does not need genproto. The
// adapters turn a Refusal into their own error type, with the
// google.rpc.ErrorInfo and google.rpc.RetryInfo details.
//
// It is internal: its users are the adapters, nested modules whose paths
// share this module's prefix. Both adapters store the same records under the
// same operation names and fingerprints, so a service that moves from one
// to the other, or serves one procedure through both, replays the records
// either wrote. Changing a rule here changes both adapters at once, which
// is the point: they cannot drift apart.
package protorpc
