// Package telemetry holds the rules every telemetry of the coordinator's
// events follows (the observability package's log lines and metrics, and
// idemotel's spans), so that a key and a store call look the same in each.
package telemetry

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"strconv"
	"strings"

	"github.com/idemkit/idempotency/coordinator/idemstore"
)

// KeyHash returns what stands for key in log lines and spans: the first 16
// hex digits (64 bits) of the SHA-256 of key, exactly as the caller gave it.
// The shell computes the same with printf %s "$KEY" | sha256sum | cut -c1-16.
func KeyHash(key string) string {
	sum := sha256.Sum256([]byte(key))
	return hex.EncodeToString(sum[:8])
}

// HashedKey is what stands for k's key in an error message when keys are
// hashed: "<key HASH>".
func HashedKey(k idemstore.Key) string { return "<key " + KeyHash(k.Key) + ">" }

// OmittedKey is what stands for a key in an error message when keys are
// omitted.
const OmittedKey = "<key>"

// minRedactLen is the shortest key that Redact replaces wherever it occurs;
// a shorter one is too likely to be part of other words.
const minRedactLen = 8

// Redact replaces k's key in an error message with hidden. The coordinator's
// and stores' messages name the key as "operation:key" (also inside a Redis
// key name) or quoted, and a key of minRedactLen bytes or more is replaced
// wherever it occurs. It is best effort: a key quoted or escaped some other
// way by a custom store stays visible.
func Redact(msg string, k idemstore.Key, hidden string) string {
	quoted := strconv.Quote(k.Key)
	// The key as %q spells it, also inside a longer quoted string: a key
	// with a quote or a backslash differs from its raw form there.
	escaped := quoted[1 : len(quoted)-1]
	if k.Key == "" || !strings.Contains(msg, k.Key) && !strings.Contains(msg, escaped) {
		return msg
	}
	msg = strings.ReplaceAll(msg, quoted, strconv.Quote(hidden))
	forms := []string{k.Key}
	if escaped != k.Key {
		forms = append(forms, escaped)
	}
	for _, f := range forms {
		msg = strings.ReplaceAll(msg, k.Operation+":"+f, k.Operation+":"+hidden)
		if len(k.Key) >= minRedactLen {
			msg = strings.ReplaceAll(msg, f, hidden)
		}
	}
	return msg
}

// Result classifies how a store call ended, as the result label of
// idempotency_storage_duration_seconds and a store span's status say.
type Result int

// The results, in label order.
const (
	ResultOK Result = iota
	ResultError
	ResultTimeout
	ResultCanceled
	NumResults
)

var resultNames = [NumResults]string{"ok", "error", "timeout", "canceled"}

// String returns the label value: ok, error, timeout or canceled.
func (r Result) String() string { return resultNames[r] }

// StorageResult classifies the error of a store call: ResultOK for nil,
// ResultCanceled for a context cancellation, ResultTimeout for a context
// deadline or an error whose Timeout method reports true, and ResultError for
// any other.
func StorageResult(err error) Result {
	switch {
	case err == nil:
		return ResultOK
	case errors.Is(err, context.Canceled):
		return ResultCanceled
	case errors.Is(err, context.DeadlineExceeded):
		return ResultTimeout
	}
	var t interface{ Timeout() bool }
	if errors.As(err, &t) && t.Timeout() {
		return ResultTimeout
	}
	return ResultError
}
