package coordinator_test

import (
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idempotency/coordinator"
	"github.com/idemkit/idempotency/coordinator/memstore"
)

func TestNewRefusesNonsense(t *testing.T) {
	tests := []struct {
		name string
		opts []coordinator.Option
		want string
	}{
		{"unknown in-flight mode", []coordinator.Option{coordinator.WithInFlight("block")}, `unknown in-flight mode "block": accepted values are wait, raise, run`},
		{"unknown storage-error mode", []coordinator.Option{coordinator.WithOnStorageError("ignore")}, `unknown on-storage-error mode "ignore": accepted values are run, raise`},
		{"zero lease", []coordinator.Option{coordinator.WithLease(0)}, "lease 0s: must be at least 1ms"},
		{"renew not shorter than lease", []coordinator.Option{coordinator.WithLease(time.Second), coordinator.WithRenewInterval(time.Second)}, "renew interval 1s: must be positive and shorter than the lease 1s"},
		{"negative renew", []coordinator.Option{coordinator.WithRenewInterval(-time.Second)}, "renew interval -1s"},
		{"negative wait", []coordinator.Option{coordinator.WithWaitTimeout(-time.Second)}, "wait timeout -1s: must not be negative"},
		{"zero poll", []coordinator.Option{coordinator.WithPollInterval(0)}, "poll interval 0s: must be positive"},
		{"zero storage timeout", []coordinator.Option{coordinator.WithStorageTimeout(0)}, "storage timeout 0s: must be positive"},
		{"min TTL below 1ms", []coordinator.Option{coordinator.WithTTLBounds(0, time.Hour)}, "min TTL 0s: must be at least 1ms"},
		{"max below min", []coordinator.Option{coordinator.WithTTLBounds(time.Hour, time.Minute)}, "max TTL 1m0s: must not be shorter than min TTL 1h0m0s"},
		{"default outside bounds", []coordinator.Option{coordinator.WithDefaultTTL(time.Hour * 24 * 31)}, "default TTL 744h0m0s: must be within [1s, 720h0m0s]"},
		{"operation TTL bad name", []coordinator.Option{coordinator.WithOperationTTLs(map[string]time.Duration{"a:b": time.Hour})}, `operation TTL for "a:b"`},
		{"operation TTL out of bounds", []coordinator.Option{coordinator.WithOperationTTLs(map[string]time.Duration{"op": time.Millisecond})}, `operation TTL for "op": 1ms must be within [1s, 720h0m0s]`},
		{"zero result cap", []coordinator.Option{coordinator.WithMaxResultBytes(0)}, "max result bytes 0: must be positive"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := coordinator.New(memstore.New(), tt.opts...)
			if err == nil || c != nil {
				t.Fatalf("New = %v, %v; want an error", c, err)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %q, want it to contain %q", err, tt.want)
			}
		})
	}
	if _, err := coordinator.New(nil); err == nil || !strings.Contains(err.Error(), "store is nil") {
		t.Fatalf("nil store: %v", err)
	}
}

func TestNewDefaults(t *testing.T) {
	c, err := coordinator.New(memstore.New(), coordinator.WithInFlight(""), coordinator.WithOnStorageError(""), coordinator.WithObserver(nil))
	if err != nil {
		t.Fatal(err)
	}
	if c.InFlight() != coordinator.InFlightWait || c.OnStorageError() != coordinator.StorageErrorRun ||
		c.Lease() != coordinator.DefaultLease || !c.Enabled() {
		t.Fatalf("defaults: %v %v %v %v", c.InFlight(), c.OnStorageError(), c.Lease(), c.Enabled())
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
		var m coordinator.StorageErrorMode
		if err := m.UnmarshalText([]byte(s)); err != nil {
			t.Errorf("storage %q: %v", s, err)
		}
	}
	var im coordinator.InFlightMode
	if err := im.UnmarshalText([]byte("WAIT")); err == nil {
		t.Error("modes are case-sensitive; WAIT accepted")
	}
	var sm coordinator.StorageErrorMode
	if err := sm.UnmarshalText([]byte("fail")); err == nil {
		t.Error("storage mode fail accepted")
	}
	if coordinator.InFlightMode("").String() != "wait" || coordinator.StorageErrorMode("").String() != "run" {
		t.Error("zero values do not print as the defaults")
	}
}
