package wire_test

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"testing"

	"github.com/idemkit/idempotency/internal/wire"
)

// The encoding is pinned: every stored fingerprint depends on it, so a
// change here would make every retry across an upgrade a key reuse.
func TestHashEncoding(t *testing.T) {
	h := wire.NewHash("d/1")
	h.String("ab")
	h.Count(2)
	h.Bytes([]byte{0xff})
	want := sha256.Sum256([]byte("" +
		"\x00\x00\x00\x00\x00\x00\x00\x03d/1" +
		"\x00\x00\x00\x00\x00\x00\x00\x02ab" +
		"\x00\x00\x00\x00\x00\x00\x00\x02" +
		"\x00\x00\x00\x00\x00\x00\x00\x01\xff"))
	if got := h.Sum(); got != hex.EncodeToString(want[:]) {
		t.Errorf("Sum = %s, want %x", got, want)
	}

	// Length prefixes keep field boundaries apart.
	a, b := wire.NewHash("d"), wire.NewHash("d")
	a.String("ab")
	a.String("c")
	b.String("a")
	b.String("bc")
	if a.Sum() == b.Sum() {
		t.Error(`"ab","c" and "a","bc" hash alike`)
	}
	if wire.NewHash("idemhttp/1").Sum() == wire.NewHash("idemgrpc/1").Sum() {
		t.Error("two domains hash alike")
	}
}

type envelope struct {
	V      int `json:"v"`
	Status int `json:"status"`
}

func TestFrame(t *testing.T) {
	b, err := wire.Frame(envelope{V: 1, Status: 201}, []byte("body\nwith a newline"))
	if err != nil {
		t.Fatal(err)
	}
	if want := "{\"v\":1,\"status\":201}\nbody\nwith a newline"; string(b) != want {
		t.Fatalf("Frame = %q, want %q", b, want)
	}
	var e envelope
	body, err := wire.Unframe(append(b[:0:0], b...), &e)
	if err != nil || e != (envelope{V: 1, Status: 201}) || string(body) != "body\nwith a newline" {
		t.Fatalf("Unframe = %+v, %q, %v", e, body, err)
	}

	// Fields the reader does not know are ignored.
	if _, err := wire.Unframe([]byte("{\"v\":1,\"new\":true}\n"), &e); err != nil {
		t.Errorf("Unframe with an unknown field: %v", err)
	}
	if _, err := wire.Unframe([]byte("{\"v\":1}"), &e); !errors.Is(err, wire.ErrNoEnvelope) {
		t.Errorf("Unframe without a newline: %v, want ErrNoEnvelope", err)
	}
	if _, err := wire.Unframe([]byte("not json\nbody"), &e); err == nil || errors.Is(err, wire.ErrNoEnvelope) {
		t.Errorf("Unframe of a bad envelope: %v, want a JSON error", err)
	}
	if _, err := wire.Frame(func() {}, nil); err == nil {
		t.Error("Frame of an envelope JSON cannot encode: no error")
	}
}
