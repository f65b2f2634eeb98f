package faultstore_test

import (
	"testing"

	"go.uber.org/goleak"
)

// The concurrency tests and the conformance suite start goroutines.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
