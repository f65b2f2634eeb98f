package observability_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemkit/idempotency/coordinator"
	"github.com/idemkit/idempotency/observability"
)

// An invalid option is an error naming the option and the value, and a nil
// option is skipped (docs/user-guide.md, "Options").
func TestNewFollowsTheOptionRule(t *testing.T) {
	o, err := observability.New(nil, observability.WithOperationLimit(0), nil)
	var oe *coordinator.OptionError
	if o != nil || !errors.As(err, &oe) || oe.Option != "WithOperationLimit" {
		t.Fatalf("New = %v, %v; want an *OptionError of WithOperationLimit", o, err)
	}
	if want := "observability: invalid options: WithOperationLimit: must be at least 1, got 0"; err.Error() != want {
		t.Fatalf("err = %q, want %q", err, want)
	}
	_, err = observability.New(observability.WithNamespace("9x"))
	if !errors.As(err, &oe) || oe.Option != "WithNamespace" || !strings.Contains(err.Error(), `"9x"`) {
		t.Fatalf("err = %v; want an *OptionError of WithNamespace quoting the value", err)
	}

	reg := prometheus.NewRegistry()
	if _, err := observability.New(nil, observability.WithRegisterer(reg), nil); err != nil {
		t.Fatalf("New with nil options: %v", err)
	}
	if mfs, err := reg.Gather(); err != nil || len(mfs) == 0 {
		t.Fatalf("Gather = %d families, %v; want the metrics of the registerer given between nil options", len(mfs), err)
	}
}
