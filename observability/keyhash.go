package observability

import (
	"github.com/idemkit/idempotency/coordinator"
)

// This file exports, for other telemetry of the coordinator's events (the
// package idemotel's spans), the rules the log lines and metrics follow, so
// that a key or a store call looks the same in a log line, a metric and a
// span.

// KeyHash returns what stands for key in log lines in mode LogKeysHashed
// (their key_hash field): the first 16 hex digits (64 bits) of the SHA-256 of
// key, exactly as the caller gave it. The shell computes the same with
// printf %s "$KEY" | sha256sum | cut -c1-16.
func KeyHash(key string) string { return hashKey(key) }

// RedactError returns the message of err as the error field of a log line of
// key k shows it in mode: with the key replaced by "<key HASH>" in mode
// LogKeysHashed (and ""), by "<key>" in mode LogKeysOmitted, and unchanged in
// mode LogKeysPlain or when k has no key. The replacement is best effort, as
// in the logs (see WithLogKeys). It returns "" for a nil err.
func RedactError(err error, k coordinator.Key, mode LogKeysMode) string {
	if err == nil {
		return ""
	}
	msg := err.Error()
	switch {
	case k.Key == "", mode == LogKeysPlain:
		return msg
	case mode == LogKeysOmitted:
		return redact(msg, k, "<key>")
	}
	return redact(msg, k, "<key "+hashKey(k.Key)+">")
}

// StorageResult classifies the error of a store call as the result label of
// idempotency_storage_duration_seconds does: "ok" for nil, "canceled" for a
// context cancellation, "timeout" for a context deadline or an error whose
// Timeout method reports true, and "error" for any other.
func StorageResult(err error) string { return resultNames[storageResult(err)] }
