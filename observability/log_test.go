package observability_test

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"testing"
	"time"

	"github.com/idemkit/idempotency/coordinator/idemevent"
	"github.com/idemkit/idempotency/coordinator/idemstore"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/idemkit/idempotency/coordinator"
	"github.com/idemkit/idempotency/observability"
)

// logged returns an Observer that logs everything into the returned logs,
// and records no metrics.
func logged(t *testing.T, opts ...observability.Option) (*observability.Observer, *observer.ObservedLogs) {
	t.Helper()
	core, logs := observer.New(zap.DebugLevel)
	o, err := observability.New(append([]observability.Option{observability.WithLogger(zap.New(core))}, opts...)...)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return o, logs
}

// only returns the one entry in logs, failing the test otherwise.
func only(t *testing.T, logs *observer.ObservedLogs) observer.LoggedEntry {
	t.Helper()
	all := logs.TakeAll()
	if len(all) != 1 {
		t.Fatalf("%d log lines, want 1: %v", len(all), all)
	}
	return all[0]
}

func TestLogLines(t *testing.T) {
	k := key("payment.charge")
	down := &coordinator.StorageError{Method: idemevent.MethodReserve, Err: errors.New("connection refused")}
	storageErr := func(t idemevent.ErrorType, m idemevent.Method) idemevent.Event {
		return idemevent.Event{Kind: idemevent.Error, Key: k, ErrorType: t, Method: m, Err: down}
	}
	tests := []struct {
		name   string
		event  idemevent.Event
		level  zapcore.Level
		msg    string
		fields map[string]any // beyond operation and key_hash
	}{
		{"hit", idemevent.Event{Kind: idemevent.Hit, Key: k},
			zap.DebugLevel, "replayed stored result", nil},
		{"miss", idemevent.Event{Kind: idemevent.Miss, Key: k},
			zap.DebugLevel, "running action", nil},
		{"stored", idemevent.Event{Kind: idemevent.Stored, Key: k},
			zap.DebugLevel, "stored result", nil},
		{"in flight", idemevent.Event{Kind: idemevent.InFlight, Key: k, Mode: string(coordinator.InFlightRaise)},
			zap.DebugLevel, "key in flight", map[string]any{"in_flight_mode": "raise"}},
		{"waited, hit", idemevent.Event{Kind: idemevent.Waited, Key: k, Outcome: idemevent.WaitHit, Duration: 50 * time.Millisecond},
			zap.DebugLevel, "stopped waiting for in-flight key", map[string]any{"wait_outcome": "hit", "duration": 50 * time.Millisecond}},
		{"waited, timeout", idemevent.Event{Kind: idemevent.Waited, Key: k, Outcome: idemevent.WaitTimeout, Duration: 30 * time.Second},
			zap.WarnLevel, "stopped waiting for in-flight key", map[string]any{"wait_outcome": "timeout", "duration": 30 * time.Second}},
		{"unprotected", idemevent.Event{Kind: idemevent.Unprotected, Key: k, Method: idemevent.MethodReserve},
			zap.WarnLevel, "running action unprotected: store failed", map[string]any{"method": "reserve"}},
		{"unprotected, no key", idemevent.Event{Kind: idemevent.Unprotected, Key: k, Method: idemevent.MethodNone},
			zap.DebugLevel, "running action unprotected: no idempotency key", map[string]any{"method": "none"}},
		{"not replayable, the key hidden", idemevent.Event{Kind: idemevent.NotReplayable, Key: k,
			Err: &coordinator.NotReplayableError{Operation: k.Operation, Key: k.Key, Reason: "the result is 2097152 bytes, more than the limit of 1048576"}},
			zap.WarnLevel, "key completed, result not replayable: action not run again", map[string]any{
				"error": `idempotency: key "<key ` + hashOf("order-42") + `>" of operation "payment.charge" completed, but its result cannot be returned: the result is 2097152 bytes, more than the limit of 1048576`}},
		{"storage call", idemevent.Event{Kind: idemevent.StorageCall, Key: k, Method: idemevent.MethodGet, Duration: time.Millisecond},
			zap.DebugLevel, "storage call", map[string]any{"method": "get", "duration": time.Millisecond}},
		{"failed storage call", idemevent.Event{Kind: idemevent.StorageCall, Key: k, Method: idemevent.MethodGet, Duration: time.Second, Err: down},
			zap.DebugLevel, "storage call", map[string]any{"method": "get", "duration": time.Second, "error": down.Error()}},

		{"storage_reserve_error", storageErr(idemevent.ErrorStorageReserve, idemevent.MethodReserve),
			zap.ErrorLevel, "storage call failed", map[string]any{"error_type": "storage_reserve_error", "method": "reserve", "error": down.Error()}},
		{"storage_get_error", storageErr(idemevent.ErrorStorageGet, idemevent.MethodGet),
			zap.ErrorLevel, "storage call failed", map[string]any{"error_type": "storage_get_error", "method": "get", "error": down.Error()}},
		{"storage_save_error", storageErr(idemevent.ErrorStorageSave, idemevent.MethodComplete),
			zap.ErrorLevel, "storage call failed", map[string]any{"error_type": "storage_save_error", "method": "complete", "error": down.Error()}},
		{"storage_release_error", storageErr(idemevent.ErrorStorageRelease, idemevent.MethodRelease),
			zap.ErrorLevel, "storage call failed", map[string]any{"error_type": "storage_release_error", "method": "release", "error": down.Error()}},
		{"storage_renew_error", storageErr(idemevent.ErrorStorageRenew, idemevent.MethodRenew),
			zap.WarnLevel, "storage call failed", map[string]any{"error_type": "storage_renew_error", "method": "renew", "error": down.Error()}},
		{"decode_error", idemevent.Event{Kind: idemevent.Error, Key: k, ErrorType: idemevent.ErrorDecode, Err: errors.New("bad json")},
			zap.ErrorLevel, "cannot decode stored record", map[string]any{"error_type": "decode_error", "error": "bad json"}},
		{"record_validation_error", idemevent.Event{Kind: idemevent.Error, Key: k, ErrorType: idemevent.ErrorRecordValidation, Err: errors.New("too large")},
			zap.ErrorLevel, "cannot store result", map[string]any{"error_type": "record_validation_error", "error": "too large"}},
		{"key_reuse", idemevent.Event{Kind: idemevent.Error, Key: k, ErrorType: idemevent.ErrorKeyReuse, Err: coordinator.ErrKeyReuse},
			zap.WarnLevel, "key reused for a different request", map[string]any{"error_type": "key_reuse", "error": coordinator.ErrKeyReuse.Error()}},
		{"lease_lost", idemevent.Event{Kind: idemevent.Error, Key: k, ErrorType: idemevent.ErrorLeaseLost, Err: coordinator.ErrLeaseLost},
			zap.ErrorLevel, "lease lost", map[string]any{"error_type": "lease_lost", "error": coordinator.ErrLeaseLost.Error()}},
		{"unknown error type", idemevent.Event{Kind: idemevent.Error, Key: k, ErrorType: "new_kind", Err: errors.New("boom")},
			zap.ErrorLevel, "idempotency error", map[string]any{"error_type": "new_kind", "error": "boom"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o, logs := logged(t)
			feed(t, o, tt.event)
			e := only(t, logs)
			if e.Level != tt.level || e.Message != tt.msg || e.LoggerName != "idempotency" {
				t.Errorf("line = %s %q (logger %q), want %s %q (logger idempotency)", e.Level, e.Message, e.LoggerName, tt.level, tt.msg)
			}
			want := map[string]any{"operation": "payment.charge", "key_hash": hashOf("order-42")}
			for f, v := range tt.fields {
				want[f] = v
			}
			got := e.ContextMap()
			for f, v := range want {
				if got[f] != v {
					t.Errorf("field %s = %#v, want %#v", f, got[f], v)
				}
			}
			if len(got) != len(want) {
				t.Errorf("fields %v, want exactly %v", got, want)
			}
		})
	}
}

func hashOf(key string) string {
	sum := sha256.Sum256([]byte(key))
	return hex.EncodeToString(sum[:])[:16]
}

func TestKeyLogging(t *testing.T) {
	tests := []struct {
		mode      observability.LogKeysMode
		field     string
		value     any
		forbidden string
	}{
		{"", "key_hash", hashOf("order-42"), "key"},
		{observability.LogKeysHashed, "key_hash", hashOf("order-42"), "key"},
		{observability.LogKeysPlain, "key", "order-42", "key_hash"},
		{observability.LogKeysOmitted, "", nil, "key"},
	}
	for _, tt := range tests {
		t.Run(tt.mode.String(), func(t *testing.T) {
			o, logs := logged(t, observability.WithLogKeys(tt.mode))
			feed(t, o, idemevent.Event{Kind: idemevent.Error, Key: key("payment.charge"),
				ErrorType: idemevent.ErrorKeyReuse, Err: coordinator.ErrKeyReuse})
			f := only(t, logs).ContextMap()
			if f["operation"] != "payment.charge" {
				t.Errorf("operation = %v, want payment.charge", f["operation"])
			}
			if tt.field != "" && f[tt.field] != tt.value {
				t.Errorf("%s = %v, want %v", tt.field, f[tt.field], tt.value)
			}
			if _, ok := f[tt.forbidden]; ok {
				t.Errorf("field %s logged in mode %s: %v", tt.forbidden, tt.mode, f)
			}
			if tt.mode == observability.LogKeysOmitted {
				if _, ok := f["key_hash"]; ok {
					t.Errorf("key_hash logged in mode omitted: %v", f)
				}
			}
		})
	}
}

func TestKeyLoggingText(t *testing.T) {
	for _, s := range []string{"hashed", "plain", "omitted", ""} {
		var m observability.LogKeysMode
		if err := m.UnmarshalText([]byte(s)); err != nil {
			t.Fatalf("UnmarshalText(%q): %v", s, err)
		}
		b, _ := m.MarshalText()
		if want := map[string]string{"": "hashed"}[s]; string(b) != s && string(b) != want {
			t.Errorf("%q round-trips to %q", s, b)
		}
	}
	var m observability.LogKeysMode
	if err := m.UnmarshalText([]byte("HASHED")); err == nil {
		t.Error("UnmarshalText(HASHED) accepted; the names are case-sensitive")
	}
}

func TestLevelsBelowTheLoggersAreNotBuilt(t *testing.T) {
	core, logs := observer.New(zap.WarnLevel)
	o, err := observability.New(observability.WithLogger(zap.New(core)))
	if err != nil {
		t.Fatal(err)
	}
	k := key("payment.charge")
	feed(t, o,
		idemevent.Event{Kind: idemevent.Hit, Key: k},
		idemevent.Event{Kind: idemevent.StorageCall, Key: k, Method: idemevent.MethodReserve},
		idemevent.Event{Kind: idemevent.InFlight, Key: k},
		idemevent.Event{Kind: idemevent.Unprotected, Key: k, Method: idemevent.MethodReserve},
	)
	if got := logs.Len(); got != 1 {
		t.Fatalf("%d lines at Warn, want 1 (the unprotected run): %v", got, logs.All())
	}
}

func TestNilLoggerLogsNothing(t *testing.T) {
	o, err := observability.New(observability.WithLogger(nil))
	if err != nil {
		t.Fatal(err)
	}
	feed(t, o, idemevent.Event{Kind: idemevent.Error, Key: key("op"), ErrorType: idemevent.ErrorLeaseLost})
}

func TestErrorMessagesDoNotLeakTheKey(t *testing.T) {
	k := idemstore.Key{Operation: "payment.charge", Key: "order-42"}
	short := idemstore.Key{Operation: "payment.charge", Key: "42"}
	hidden := "<key " + hashOf("order-42") + ">"
	tests := []struct {
		name string
		mode observability.LogKeysMode
		key  idemstore.Key
		err  error
		want string
	}{
		{"key reuse, hashed", observability.LogKeysHashed, k,
			&coordinator.KeyReuseError{Operation: k.Operation, Key: k.Key, Stored: "fp-a", Got: "fp-b"},
			`idempotency: key "` + hidden + `" of operation "payment.charge" reused for a different request (stored fingerprint "fp-a", got "fp-b")`},
		{"key reuse, omitted", observability.LogKeysOmitted, k,
			&coordinator.KeyReuseError{Operation: k.Operation, Key: k.Key, Stored: "fp-a", Got: "fp-b"},
			`idempotency: key "<key>" of operation "payment.charge" reused for a different request (stored fingerprint "fp-a", got "fp-b")`},
		{"redis key name in a driver error", observability.LogKeysHashed, k,
			&coordinator.StorageError{Method: idemevent.MethodGet, Err: errors.New("WRONGTYPE idempotency:payment.charge:order-42")},
			"idempotency: storage get: WRONGTYPE idempotency:payment.charge:" + hidden},
		{"plain key anywhere", observability.LogKeysOmitted, k,
			errors.New("record order-42 is corrupt"),
			"record <key> is corrupt"},
		{"short key only in unambiguous forms", observability.LogKeysOmitted, short,
			&coordinator.KeyReuseError{Operation: short.Operation, Key: short.Key, Stored: "a42", Got: "b42"},
			`idempotency: key "<key>" of operation "payment.charge" reused for a different request (stored fingerprint "a42", got "b42")`},
		{"plain mode keeps the message", observability.LogKeysPlain, k,
			&coordinator.KeyReuseError{Operation: k.Operation, Key: k.Key, Stored: "fp-a", Got: "fp-b"},
			`idempotency: key "order-42" of operation "payment.charge" reused for a different request (stored fingerprint "fp-a", got "fp-b")`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o, logs := logged(t, observability.WithLogKeys(tt.mode))
			feed(t, o, idemevent.Event{Kind: idemevent.Error, Key: tt.key, ErrorType: idemevent.ErrorKeyReuse, Err: tt.err})
			if got := only(t, logs).ContextMap()["error"]; got != tt.want {
				t.Fatalf("error = %q\n          want %q", got, tt.want)
			}
		})
	}
}
