package storetest_test

import (
	"testing"

	"go.uber.org/goleak"
)

// The suite's concurrency subtests start goroutines.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
