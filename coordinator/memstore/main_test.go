package memstore_test

import (
	"testing"

	"go.uber.org/goleak"
)

// The conformance suite's concurrency subtests start goroutines.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
