package idemgrpc

import (
	"google.golang.org/protobuf/proto"

	"github.com/idemkit/idempotency/internal/wire"
)

// fingerprint returns the lowercase hex SHA-256 over the full method name
// and the request message in deterministic protobuf encoding (map entries
// sorted by key), each length-prefixed. Unknown fields the client sent are
// part of the encoding, so they are fingerprinted too.
func fingerprint(fullMethod string, req proto.Message) (string, error) {
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(req)
	if err != nil {
		return "", err
	}
	h := wire.NewHash("idemgrpc/1")
	h.String(fullMethod)
	h.Bytes(b)
	return h.Sum(), nil
}
