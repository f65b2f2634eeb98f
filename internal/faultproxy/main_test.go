package faultproxy_test

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/idemkit/idempotency/internal/redistest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(redistest.Main(m))
}
