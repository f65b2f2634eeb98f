package coordinator_test

import (
	"context"
	"errors"
	"regexp"
	"testing"

	"github.com/idemkit/idempotency/coordinator"
	"github.com/idemkit/idempotency/coordinator/memstore"
)

var (
	keyRule = regexp.MustCompile(`^[\x21-\x7e]{1,255}$`)
	opRule  = regexp.MustCompile(`^[A-Za-z0-9._-]{1,100}$`)
)

// FuzzValidation checks the key and operation rules against an independent
// statement of them, and that a call with any operation and key either is
// refused with ErrInvalidRequest before the store is touched or runs.
func FuzzValidation(f *testing.F) {
	for _, seed := range [][2]string{
		{"payment.charge", "order-42"}, {"", ""}, {"op", " k"}, {"op:x", "k"}, {"op", "k\x00"},
		{"op", "{tag}:\"'\\"}, {"op", "\u00e9"}, {"o p", "k"}, {"op", "\x7f"}, {"op", "\x21\x7e"},
	} {
		f.Add(seed[0], seed[1])
	}
	c, err := coordinator.New(memstore.New())
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, op, key string) {
		keyOK := coordinator.ValidateKey(key) == nil
		if keyOK != keyRule.MatchString(key) {
			t.Fatalf("ValidateKey(%q) ok=%v, rule says %v", key, keyOK, !keyOK)
		}
		opOK := coordinator.ValidateOperation(op) == nil
		if opOK != opRule.MatchString(op) {
			t.Fatalf("ValidateOperation(%q) ok=%v, rule says %v", op, opOK, !opOK)
		}
		ran := false
		_, err := c.Execute(context.Background(), coordinator.Call{Operation: op, Key: key}, func(context.Context) ([]byte, error) {
			ran = true
			return []byte("1"), nil
		})
		valid := opOK && (keyOK || key == "")
		switch {
		case valid && (err != nil || !ran && key == ""):
			t.Fatalf("valid call %q/%q: ran=%v err=%v", op, key, ran, err)
		case !valid && (!errors.Is(err, coordinator.ErrInvalidRequest) || ran):
			t.Fatalf("invalid call %q/%q: ran=%v err=%v", op, key, ran, err)
		}
	})
}
