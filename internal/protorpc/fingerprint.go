package protorpc

import (
	"google.golang.org/protobuf/proto"

	"github.com/idemkit/idempotency/internal/wire"
)

// fingerprintDomain is the fingerprint's version tag. It names idemgrpc,
// which defined it first; idemconnect uses it too, so that both adapters
// fingerprint a request alike and each replays the other's records.
const fingerprintDomain = "idemgrpc/1"

// Fingerprint returns the lowercase hex SHA-256 over the full procedure
// (method) name and the request message in deterministic protobuf encoding
// (map entries sorted by key), each length-prefixed. Unknown fields the
// client sent are part of the encoding, so they are fingerprinted too.
func Fingerprint(procedure string, req proto.Message) (string, error) {
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(req)
	if err != nil {
		return "", err
	}
	h := wire.NewHash(fingerprintDomain)
	h.String(procedure)
	h.Bytes(b)
	return h.Sum(), nil
}
