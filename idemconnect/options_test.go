package idemconnect_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idempotency/coordinator"
	"github.com/idemkit/idempotency/idemconnect"
)

// An invalid option makes both constructors return an error that names
// the option and the value; a nil option is skipped.
func TestConstructorsRefuseBadOptions(t *testing.T) {
	c, _ := newCoordinator(t, nil)
	for _, tc := range []struct {
		name   string
		opt    idemconnect.Option
		option string // the option the error names
		value  string // and the value it quotes
	}{
		{"reserved header", idemconnect.WithKeyHeader("grpc-key"), "WithKeyHeader", `"Grpc-Key"`},
		{"connect header", idemconnect.WithKeyHeader("Connect-Key"), "WithKeyHeader", `"Connect-Key"`},
		{"binary header", idemconnect.WithKeyHeader("key-bin"), "WithKeyHeader", `"Key-Bin"`},
		{"empty header", idemconnect.WithKeyHeader(""), "WithKeyHeader", `got ""`},
		{"bad header", idemconnect.WithKeyHeader("idempotency key"), "WithKeyHeader", `"idempotency key"`},
		{"no procedures", idemconnect.WithProcedures(), "WithProcedures", "got none"},
		{"bad procedure", idemconnect.WithProcedures("payments.v1.Payments/Charge"), "WithProcedures", `"payments.v1.Payments/Charge"`},
		{"negative TTL", idemconnect.WithTTL(-time.Second), "WithTTL", "got -1s"},
		{"zero retry after", idemconnect.WithRetryAfter(0), "WithRetryAfter", "got 0s"},
	} {
		for side, build := range map[string]func() error{
			"server": func() error { _, err := idemconnect.NewInterceptor(c, nil, tc.opt); return err },
			"client": func() error { _, err := idemconnect.NewClientInterceptor(nil, tc.opt); return err },
		} {
			t.Run(side+"/"+tc.name, func(t *testing.T) {
				err := build()
				var oe *coordinator.OptionError
				if !errors.As(err, &oe) || oe.Option != tc.option {
					t.Fatalf("error %v; want a *coordinator.OptionError for %s", err, tc.option)
				}
				if msg := err.Error(); !strings.HasPrefix(msg, "idemconnect: invalid options: "+tc.option+": ") || !strings.Contains(msg, tc.value) {
					t.Fatalf("error %q does not name %s and %s", msg, tc.option, tc.value)
				}
			})
		}
	}
	if _, err := idemconnect.NewInterceptor(nil); err == nil {
		t.Error("NewInterceptor(nil) returned no error")
	}
	// A nil option is skipped, alone or among others.
	for _, err := range []error{
		second(idemconnect.NewInterceptor(c, nil)),
		second(idemconnect.NewInterceptor(c, nil, idemconnect.WithKeyRequired(true), nil)),
		second(idemconnect.NewClientInterceptor(nil)),
		second(idemconnect.NewClientInterceptor(nil, idemconnect.WithKeyHeader("x-key"), nil)),
	} {
		if err != nil {
			t.Error(err)
		}
	}
}

func second[T any](_ T, err error) error { return err }
