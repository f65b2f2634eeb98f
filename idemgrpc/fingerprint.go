package idemgrpc

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"hash"

	"google.golang.org/protobuf/proto"
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
	h := sha256.New()
	field(h, "idemgrpc/1")
	field(h, fullMethod)
	count(h, len(b))
	h.Write(b)
	return hex.EncodeToString(h.Sum(nil)), nil
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
