package idemhttp_test

import (
	"errors"
	"net/http"
	"strings"
	"testing"

	"github.com/idemkit/idempotency/coordinator"
	"github.com/idemkit/idempotency/idemhttp"
)

// An invalid option makes Middleware panic with an error that names the
// option and the value; a nil option is skipped (docs/user-guide.md,
// "Options").
func TestMiddlewarePanicsOnBadConfiguration(t *testing.T) {
	c, _ := newCoordinator(t)
	defer func() {
		if r := recover(); r != "idemhttp: Middleware: coordinator is nil" {
			t.Fatalf("nil coordinator: recovered %v", r)
		}
	}()
	for _, tc := range []struct {
		name   string
		opt    idemhttp.Option
		option string // the option the panic names
		value  string // and the value it quotes
	}{
		{"no methods", idemhttp.WithMethods(), "WithMethods", "got none"},
		{"empty method", idemhttp.WithMethods("POST", ""), "WithMethods", `got ""`},
		{"method with a space", idemhttp.WithMethods("POST /x"), "WithMethods", `"POST /x"`},
		{"fingerprint header with a colon", idemhttp.WithFingerprintHeaders("X-Account:"), "WithFingerprintHeaders", `"X-Account:"`},
		{"empty replay header", idemhttp.WithReplayHeaders(""), "WithReplayHeaders", `got ""`},
		{"bad operation", idemhttp.WithOperation("POST /payments"), "WithOperation", `"POST /payments"`},
		{"zero body limit", idemhttp.WithMaxBodyBytes(0), "WithMaxBodyBytes", "got 0"},
		{"zero response limit", idemhttp.WithMaxResponseBytes(0), "WithMaxResponseBytes", "got 0"},
		{"negative TTL", idemhttp.WithTTL(-1), "WithTTL", "got -1ns"},
		{"zero retry after", idemhttp.WithRetryAfter(0), "WithRetryAfter", "got 0s"},
		{"Set-Cookie replayed", idemhttp.WithReplayHeaders("Content-Type", "set-cookie"), "WithReplayHeaders", "got Set-Cookie"},
		{"Authorization replayed", idemhttp.WithReplayHeaders("Authorization"), "WithReplayHeaders", "got Authorization"},
		{"trailer replayed", idemhttp.WithReplayHeaders(http.TrailerPrefix + "X-Checksum"), "WithReplayHeaders", "got Trailer:X-Checksum"},
		{"challenge with a newline", idemhttp.WithAuthChallenge("Bearer\r\nX-Evil: 1"), "WithAuthChallenge", `"Bearer\r\nX-Evil: 1"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			defer func() {
				err, _ := recover().(error)
				var oe *coordinator.OptionError
				if !errors.As(err, &oe) || oe.Option != tc.option {
					t.Fatalf("recovered %v; want an error with a *coordinator.OptionError for %s", err, tc.option)
				}
				if msg := err.Error(); !strings.HasPrefix(msg, "idemhttp: invalid options: "+tc.option+": ") || !strings.Contains(msg, tc.value) {
					t.Fatalf("panic %q does not name %s and %s", msg, tc.option, tc.value)
				}
			}()
			idemhttp.Middleware(c, nil, tc.opt)
		})
	}
	// A nil option is skipped, alone or among others.
	idemhttp.Middleware(c, nil)
	idemhttp.Middleware(c, nil, idemhttp.WithKeyRequired(true), nil)
	idemhttp.Middleware(nil)
}
