package idempotency_test

import (
	"testing"

	"go.uber.org/fx"
	"go.uber.org/fx/fxtest"

	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/coordinator"
)

// A nil settings change is skipped, as a nil option is in every package
// (docs/user-guide.md, "Options"), and the changes beside it still apply.
func TestNilSettingsOverridesAreSkipped(t *testing.T) {
	clearEnv(t)
	var s idempotency.Settings
	app := fxtest.New(t, fx.NopLogger, idempotency.Module,
		idempotency.OverrideSettings(nil),
		idempotency.OverrideSettingsWith[*testing.T](nil), // nothing in the graph provides a *testing.T
		idempotency.OverrideSettings(func(s *idempotency.Settings) { s.InFlight = coordinator.InFlightRaise }),
		fx.Populate(&s))
	if err := app.Err(); err != nil {
		t.Fatal(err)
	}
	if s.InFlight != coordinator.InFlightRaise {
		t.Fatalf("in-flight %v, want raise: the override beside the nil ones was lost", s.InFlight)
	}
}
