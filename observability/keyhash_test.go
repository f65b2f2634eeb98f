package observability_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"testing"

	"github.com/idemkit/idempotency/coordinator/idemevent"
	"github.com/idemkit/idempotency/coordinator/idemstore"

	"github.com/idemkit/idempotency/coordinator"
	"github.com/idemkit/idempotency/internal/telemetry"
	"github.com/idemkit/idempotency/observability"
)

// telemetry.KeyHash is the key_hash of the log lines, and the shell's digest.
func TestKeyHashIsTheLogLinesHash(t *testing.T) {
	for _, k := range []string{"order-42", "ünïcødé key", "a:b:c"} {
		o, logs := logged(t)
		feed(t, o, idemevent.Event{Kind: idemevent.Hit, Key: idemstore.Key{Operation: "op", Key: k}})
		got := only(t, logs).ContextMap()["key_hash"]
		if want := telemetry.KeyHash(k); got != want || want != hashOf(k) {
			t.Errorf("KeyHash(%q) = %q; the log line has %v, sha256 gives %q", k, want, got, hashOf(k))
		}
	}
	// printf %s order-42 | sha256sum | cut -c1-16
	if got := telemetry.KeyHash("order-42"); got != "3bf8b157c4238eef" {
		t.Errorf("KeyHash(order-42) = %q, want 3bf8b157c4238eef", got)
	}
}

// telemetry.Redact is the error field of the log lines, in every mode.
func TestRedactErrorIsTheLogLinesErrorField(t *testing.T) {
	k := idemstore.Key{Operation: "payment.charge", Key: "order-42"}
	short := idemstore.Key{Operation: "payment.charge", Key: "42"}
	errs := []error{
		&coordinator.KeyReuseError{Operation: k.Operation, Key: k.Key, Stored: "fp-a", Got: "fp-b"},
		&coordinator.StorageError{Method: idemevent.MethodGet, Err: errors.New("WRONGTYPE idempotency:payment.charge:order-42")},
		errors.New("record order-42 is corrupt"),
		errors.New("nothing to hide"),
	}
	modes := []observability.LogKeysMode{"", observability.LogKeysHashed, observability.LogKeysPlain, observability.LogKeysOmitted}
	for _, key := range []idemstore.Key{k, short, {Operation: "payment.charge"}} {
		for _, mode := range modes {
			for _, err := range errs {
				o, logs := logged(t, observability.WithLogKeys(mode))
				feed(t, o, idemevent.Event{Kind: idemevent.Error, Key: key, ErrorType: idemevent.ErrorDecode, Err: err})
				want := only(t, logs).ContextMap()["error"]
				if got := redacted(err, key, mode); got != want {
					t.Errorf("telemetry.Redact(%q, %v) in mode %q = %q; the log line has %q", err, key, mode, got, want)
				}
			}
		}
	}
}

// redacted is err's message as telemetry.Redact hides key in mode.
func redacted(err error, k idemstore.Key, mode observability.LogKeysMode) string {
	switch {
	case k.Key == "", mode == observability.LogKeysPlain:
		return err.Error()
	case mode == observability.LogKeysOmitted:
		return telemetry.Redact(err.Error(), k, telemetry.OmittedKey)
	}
	return telemetry.Redact(err.Error(), k, telemetry.HashedKey(k))
}

// telemetry.StorageResult is the result label of the storage histogram.
func TestStorageResultIsTheMetricsLabel(t *testing.T) {
	tests := []struct {
		err  error
		want string
	}{
		{nil, "ok"},
		{errors.New("connection refused"), "error"},
		{&coordinator.StorageError{Method: idemevent.MethodGet, Err: context.DeadlineExceeded}, "timeout"},
		{fmt.Errorf("read: %w", timeoutError{}), "timeout"},
		{&net.OpError{Op: "read", Err: os.ErrDeadlineExceeded}, "timeout"},
		{fmt.Errorf("get: %w", context.Canceled), "canceled"},
	}
	for _, tt := range tests {
		if got := telemetry.StorageResult(tt.err).String(); got != tt.want {
			t.Errorf("StorageResult(%v) = %q, want %q", tt.err, got, tt.want)
		}
		o, reg := newObserver(t)
		feed(t, o, idemevent.Event{Kind: idemevent.StorageCall, Key: key("op"), Method: idemevent.MethodGet, Err: tt.err})
		if n, _ := histogram(t, reg, "idempotency_storage_duration_seconds", "method", "get", "result", tt.want); n != 1 {
			t.Errorf("%v: %d samples under result=%q, want 1", tt.err, n, tt.want)
		}
	}
}
