package wire

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"hash"
)

// Hash is a SHA-256 over length-prefixed fields, so that no two different
// sequences of fields share an encoding; its zero value is not usable (use
// NewHash).
type Hash struct{ h hash.Hash }

// NewHash returns a Hash whose first field is domain (such as "idemhttp/1"),
// which keeps the fingerprints of different adapters and versions apart.
func NewHash(domain string) *Hash {
	h := &Hash{h: sha256.New()}
	h.String(domain)
	return h
}

// String adds s: its length as a big-endian uint64, then its bytes.
func (h *Hash) String(s string) {
	h.Count(len(s))
	h.h.Write([]byte(s))
}

// Bytes adds b: its length as a big-endian uint64, then its bytes.
func (h *Hash) Bytes(b []byte) {
	h.Count(len(b))
	h.h.Write(b)
}

// Count adds n as a big-endian uint64, as a field's length is written: the
// number of values that follow, say.
func (h *Hash) Count(n int) {
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], uint64(n))
	h.h.Write(b[:])
}

// Sum returns the lowercase hex SHA-256 of the fields added so far.
func (h *Hash) Sum() string { return hex.EncodeToString(h.h.Sum(nil)) }
