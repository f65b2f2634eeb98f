package observability_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/idemkit/idempotency/coordinator"
	"github.com/idemkit/idempotency/observability"
)

// The key_hash of a log line, to find the lines (or spans) of a known key.
func ExampleKeyHash() {
	fmt.Println(observability.KeyHash("order-42"))
	// Output:
	// 3bf8b157c4238eef
}

// An error message with the key hidden, as log lines show it.
func ExampleRedactError() {
	k := coordinator.Key{Operation: "payment.charge", Key: "order-42"}
	err := &coordinator.KeyReuseError{Operation: k.Operation, Key: k.Key, Stored: "fp-a", Got: "fp-b"}
	for _, mode := range []observability.LogKeysMode{observability.LogKeysHashed, observability.LogKeysOmitted, observability.LogKeysPlain} {
		fmt.Println(observability.RedactError(err, k, mode))
	}
	// Output:
	// idempotency: key "<key 3bf8b157c4238eef>" of operation "payment.charge" reused for a different request (stored fingerprint "fp-a", got "fp-b")
	// idempotency: key "<key>" of operation "payment.charge" reused for a different request (stored fingerprint "fp-a", got "fp-b")
	// idempotency: key "order-42" of operation "payment.charge" reused for a different request (stored fingerprint "fp-a", got "fp-b")
}

// The result label of a store call.
func ExampleStorageResult() {
	fmt.Println(observability.StorageResult(nil))
	fmt.Println(observability.StorageResult(errors.New("connection refused")))
	fmt.Println(observability.StorageResult(context.DeadlineExceeded))
	fmt.Println(observability.StorageResult(context.Canceled))
	// Output:
	// ok
	// error
	// timeout
	// canceled
}
