package mixin_test

import (
	"bytes"
	"os"
	"testing"

	"github.com/idemkit/idempotency/observability/mixin"
)

func TestDashboardIsGenerated(t *testing.T) {
	want, err := mixin.Dashboard("")
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile("dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatal("dashboard.json differs from what the generator writes; run go generate ./... in observability/mixin and commit the result")
	}
}
