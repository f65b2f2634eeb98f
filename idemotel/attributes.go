package idemotel

import "go.opentelemetry.io/otel/attribute"

// The attribute keys. doc.go and docs/tracing.md list them with their
// values; the tests pin their names.
const (
	keyOperation    = attribute.Key("idempotency.operation")
	keyKeyHash      = attribute.Key("idempotency.key_hash")
	keyOutcome      = attribute.Key("idempotency.outcome")
	keyReplayed     = attribute.Key("idempotency.replayed")
	keyInFlightMode = attribute.Key("idempotency.in_flight.mode")
	keyWaitOutcome  = attribute.Key("idempotency.wait.outcome")
	keyWaitDuration = attribute.Key("idempotency.wait.duration")
	keyErrorType    = attribute.Key("idempotency.error_type")
	keyMethod       = attribute.Key("idempotency.storage.method")
	keyStorageTime  = attribute.Key("idempotency.storage.duration")
	keyResult       = attribute.Key("idempotency.storage.result")
	keyExcType      = attribute.Key("exception.type")
	keyExcMessage   = attribute.Key("exception.message")
)

// The names of the span events, one per idemevent.Kind.
const (
	eventHit         = "idempotency.hit"
	eventMiss        = "idempotency.miss"
	eventInFlight    = "idempotency.in_flight"
	eventWaited      = "idempotency.waited"
	eventError       = "idempotency.error"
	eventStorageCall = "idempotency.storage_call"
	eventStored      = "idempotency.stored"
	eventUnprotected = "idempotency.unprotected"
	eventNotReplay   = "idempotency.not_replayable"
)

// storeSpanPrefix starts the name of a store span: "idempotency.store get".
const storeSpanPrefix = "idempotency.store "
