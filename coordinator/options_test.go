package coordinator_test

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idempotency/coordinator"
	"github.com/idemkit/idempotency/coordinator/memstore"
)

func TestNewRefusesNonsense(t *testing.T) {
	ms := time.Millisecond
	tests := []struct {
		name   string
		opts   []coordinator.Option
		option string // the option OptionError names
		want   string
	}{
		{"unknown in-flight mode", []coordinator.Option{coordinator.WithInFlight("block")}, "WithInFlight", `unknown in-flight mode "block": accepted values are wait, raise, run`},
		{"unknown storage-error mode", []coordinator.Option{coordinator.WithOnStorageError("ignore")}, "WithOnStorageError", `unknown on-storage-error mode "ignore": accepted values are run, raise`},
		{"zero lease", []coordinator.Option{coordinator.WithLease(0)}, "WithLease", "must be at least 1ms, got 0s"},
		{"lease rounds to zero", []coordinator.Option{coordinator.WithLease(900 * time.Microsecond)}, "WithLease", "must be at least 1ms, got 900µs"},
		{"renew not shorter than lease", []coordinator.Option{coordinator.WithLease(time.Second), coordinator.WithRenewInterval(time.Second)}, "WithRenewInterval", "must be shorter than WithLease (1s), got 1s"},
		{"renew not shorter than the rounded lease", []coordinator.Option{coordinator.WithLease(1500 * time.Microsecond), coordinator.WithRenewInterval(1200 * time.Microsecond)}, "WithRenewInterval", "must be shorter than WithLease (1ms, rounded down from 1.5ms), got 1.2ms"},
		{"lease too short for a slow renewal", []coordinator.Option{coordinator.WithLease(300 * time.Millisecond), coordinator.WithStorageTimeout(time.Second)}, "WithLease", "must be longer than WithRenewInterval (100ms) plus WithStorageTimeout (1s) plus a tenth of itself (the watchdog's margin), so that one slow renewal cannot lose it: more than 1.222s, got 300ms"},
		{"negative renew", []coordinator.Option{coordinator.WithRenewInterval(-time.Second)}, "WithRenewInterval", "must not be negative (0s means a third of the lease), got -1s"},
		{"negative wait", []coordinator.Option{coordinator.WithWaitTimeout(-time.Second)}, "WithWaitTimeout", "must not be negative (0s means one lease), got -1s"},
		{"zero poll", []coordinator.Option{coordinator.WithPollInterval(0)}, "WithPollInterval", "must be positive, got 0s"},
		{"zero storage timeout", []coordinator.Option{coordinator.WithStorageTimeout(0)}, "WithStorageTimeout", "must be positive, got 0s"},
		{"min TTL below 1ms", []coordinator.Option{coordinator.WithMinTTL(ms / 2)}, "WithMinTTL", "must be at least 1ms, got 500µs"},
		{"max below min", []coordinator.Option{coordinator.WithMinTTL(time.Hour), coordinator.WithMaxTTL(time.Minute), coordinator.WithDefaultTTL(time.Hour)}, "WithMaxTTL", "must not be shorter than WithMinTTL (1h0m0s), got 1m0s"},
		{"default outside bounds", []coordinator.Option{coordinator.WithDefaultTTL(time.Hour * 24 * 31)}, "WithDefaultTTL", "must be within WithMinTTL and WithMaxTTL [1s, 720h0m0s], got 744h0m0s"},
		{"operation TTL bad name", []coordinator.Option{coordinator.WithOperationTTLs(map[string]time.Duration{"a:b": time.Hour})}, "WithOperationTTLs", `operation "a:b" has byte 0x3a at offset 1`},
		{"operation TTL out of bounds", []coordinator.Option{coordinator.WithOperationTTLs(map[string]time.Duration{"op": time.Millisecond})}, "WithOperationTTLs", `operation "op": TTL 1ms is not within WithMinTTL and WithMaxTTL [1s, 720h0m0s]`},
		{"zero result cap", []coordinator.Option{coordinator.WithMaxResultBytes(0)}, "WithMaxResultBytes", "must be positive, got 0"},
		{"fenced operation bad name", []coordinator.Option{coordinator.WithFencedOperations("payment.charge", "a b")}, "WithFencedOperations", `operation "a b" has byte 0x20 at offset 1`},
		{"fenced operation empty", []coordinator.Option{coordinator.WithFencedOperations("")}, "WithFencedOperations", `operation "": operation is empty`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := coordinator.New(memstore.New(), tt.opts...)
			if err == nil || c != nil {
				t.Fatalf("New = %v, %v; want an error", c, err)
			}
			var oe *coordinator.OptionError
			if !errors.As(err, &oe) {
				t.Fatalf("err = %q, want an *OptionError", err)
			}
			if oe.Option != tt.option || !strings.Contains(oe.Err.Error(), tt.want) {
				t.Fatalf("OptionError = %s: %q; want %s: %q", oe.Option, oe.Err, tt.option, tt.want)
			}
			if !strings.HasPrefix(err.Error(), "idempotency: invalid coordinator configuration: "+tt.option+": ") {
				t.Fatalf("err = %q, want it to name %s", err, tt.option)
			}
			if verr := coordinator.ValidateOptions(tt.opts...); verr == nil || verr.Error() != err.Error() {
				t.Fatalf("ValidateOptions = %v, want New's error %v", verr, err)
			}
		})
	}
	if _, err := coordinator.New(nil); err == nil || !strings.Contains(err.Error(), "store is nil") {
		t.Fatalf("nil store: %v", err)
	}
}

func TestNewReportsEveryRefusedOption(t *testing.T) {
	err := coordinator.ValidateOptions(coordinator.WithLease(0), coordinator.WithPollInterval(0), coordinator.WithMaxResultBytes(-1))
	var got []string
	for _, e := range err.(interface{ Unwrap() error }).Unwrap().(interface{ Unwrap() []error }).Unwrap() {
		var oe *coordinator.OptionError
		if !errors.As(e, &oe) {
			t.Fatalf("%v is not an *OptionError", e)
		}
		got = append(got, oe.Option)
	}
	if want := []string{"WithLease", "WithPollInterval", "WithMaxResultBytes"}; !slices.Equal(got, want) {
		t.Fatalf("refused options = %v, want %v", got, want)
	}
}

func TestNewDefaults(t *testing.T) {
	if err := coordinator.ValidateOptions(); err != nil {
		t.Fatalf("the defaults are refused: %v", err)
	}
	c, err := coordinator.New(memstore.New(), coordinator.WithInFlight(""), coordinator.WithOnStorageError(""), coordinator.WithObserver(nil))
	if err != nil {
		t.Fatal(err)
	}
	if !c.Enabled() {
		t.Fatal("Enabled() = false by default")
	}
}

func TestModesParse(t *testing.T) {
	for _, s := range []string{"", "wait", "raise", "run"} {
		var m coordinator.InFlightMode
		if err := m.UnmarshalText([]byte(s)); err != nil {
			t.Errorf("in-flight %q: %v", s, err)
		}
		if b, _ := m.MarshalText(); s != "" && string(b) != s {
			t.Errorf("in-flight %q round trips to %q", s, b)
		}
	}
	for _, s := range []string{"", "run", "raise"} {
		var m coordinator.OnStorageErrorMode
		if err := m.UnmarshalText([]byte(s)); err != nil {
			t.Errorf("storage %q: %v", s, err)
		}
	}
	var im coordinator.InFlightMode
	if err := im.UnmarshalText([]byte("WAIT")); err == nil {
		t.Error("modes are case-sensitive; WAIT accepted")
	}
	var sm coordinator.OnStorageErrorMode
	if err := sm.UnmarshalText([]byte("fail")); err == nil {
		t.Error("storage mode fail accepted")
	}
	if coordinator.InFlightMode("").String() != "wait" || coordinator.OnStorageErrorMode("").String() != "run" {
		t.Error("zero values do not print as the defaults")
	}
}

// A nil option is skipped, and an invalid one after it is still refused
// (docs/user-guide.md, "Options").
func TestNewSkipsNilOptions(t *testing.T) {
	if _, err := coordinator.New(memstore.New(), nil); err != nil {
		t.Fatalf("New(store, nil): %v", err)
	}
	_, err := coordinator.New(memstore.New(), nil, coordinator.WithLease(0), nil)
	var oe *coordinator.OptionError
	if !errors.As(err, &oe) || oe.Option != "WithLease" || !strings.Contains(err.Error(), "got 0s") {
		t.Fatalf("err = %v; want an *OptionError of WithLease naming the value", err)
	}
}
