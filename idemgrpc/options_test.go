package idemgrpc_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idempotency/coordinator"
	"github.com/idemkit/idempotency/idemgrpc"
)

// An invalid option makes both interceptors panic with an error that names
// the option and the value; a nil option is skipped (docs/user-guide.md,
// "Options").
func TestInterceptorsPanicOnBadOptions(t *testing.T) {
	c, _ := newCoordinator(t, nil)
	for _, tc := range []struct {
		name   string
		opt    idemgrpc.Option
		option string // the option the panic names
		value  string // and the value it quotes
	}{
		{"reserved header", idemgrpc.WithKeyHeader("grpc-key"), "WithKeyHeader", `"grpc-key"`},
		{"binary header", idemgrpc.WithKeyHeader("key-bin"), "WithKeyHeader", `"key-bin"`},
		{"empty header", idemgrpc.WithKeyHeader(""), "WithKeyHeader", `got ""`},
		{"bad header", idemgrpc.WithKeyHeader("idempotency key"), "WithKeyHeader", `"idempotency key"`},
		{"no methods", idemgrpc.WithMethods(), "WithMethods", "got none"},
		{"bad method", idemgrpc.WithMethods("payments.v1.Payments/Charge"), "WithMethods", `"payments.v1.Payments/Charge"`},
		{"negative TTL", idemgrpc.WithTTL(-time.Second), "WithTTL", "got -1s"},
		{"zero retry after", idemgrpc.WithRetryAfter(0), "WithRetryAfter", "got 0s"},
	} {
		for side, build := range map[string]func(){
			"server": func() { idemgrpc.UnaryServerInterceptor(c, nil, tc.opt) },
			"client": func() { idemgrpc.UnaryClientInterceptor(nil, tc.opt) },
		} {
			t.Run(side+"/"+tc.name, func(t *testing.T) {
				defer func() {
					err, _ := recover().(error)
					var oe *coordinator.OptionError
					if !errors.As(err, &oe) || oe.Option != tc.option {
						t.Fatalf("recovered %v; want an error with a *coordinator.OptionError for %s", err, tc.option)
					}
					if msg := err.Error(); !strings.HasPrefix(msg, "idemgrpc: invalid options: "+tc.option+": ") || !strings.Contains(msg, tc.value) {
						t.Fatalf("panic %q does not name %s and %s", msg, tc.option, tc.value)
					}
				}()
				build()
			})
		}
	}
	// A nil option is skipped, alone or among others.
	idemgrpc.UnaryServerInterceptor(c, nil)
	idemgrpc.UnaryServerInterceptor(c, nil, idemgrpc.WithKeyRequired(true), nil)
	idemgrpc.UnaryClientInterceptor(nil)
	idemgrpc.UnaryClientInterceptor(nil, idemgrpc.WithKeyHeader("x-key"), nil)
}
