// Package observability turns the events of the idempotency coordinator into
// Prometheus metrics and zap log lines.
//
// An Observer implements idemevent.Observer. Build one with New and hand it
// to the coordinator:
//
//	obs, err := observability.New(
//		observability.WithRegisterer(prometheus.DefaultRegisterer),
//		observability.WithLogger(logger),
//		observability.WithOperations("payment.charge", "order.create"),
//	)
//	if err != nil {
//		return err
//	}
//	c, err := coordinator.New(store, coordinator.WithObserver(obs))
//
// # Metrics
//
// Every metric is named idempotency_<thing>_<unit>, prefixed with
// "<namespace>_" when WithNamespace gives one:
//
//	idempotency_requests_total{operation,outcome}          counter
//	idempotency_errors_total{operation,error_type}         counter
//	idempotency_stored_total{operation}                    counter
//	idempotency_unprotected_total{operation,method}        counter
//	idempotency_wait_duration_seconds{operation,outcome}   histogram
//	idempotency_storage_duration_seconds{method,result}    histogram
//	idempotency_storage_refusals_total{operation,reason}   counter
//	idempotency_bulk_keys_total{operation,outcome}         counter
//
// storage_refusals_total counts the storage errors (also counted in
// errors_total) that were refusals: Redis answered but refused the
// credentials, a permission or the database, or the module's circuit
// breaker was open (reason credentials, permission, database,
// breaker_open).
//
// The labels are small fixed sets, never the idempotency key. The values of
// error_type, method and the wait outcome come from idemevent.ErrorTypes,
// idemevent.Methods and idemevent.WaitOutcomes, and New creates every
// combination at zero. Operations are not known in advance: New creates the
// series of those given to WithOperations, and any other operation gets its
// series on its first event, up to the limit of WithOperationLimit; beyond
// it, events are counted under OtherOperation.
//
// Metrics are registered only with the prometheus.Registerer given to
// WithRegisterer; without one, none are recorded. Two Observers built on the
// same registerer (one fx app per test, in one process) share the registered
// collectors instead of failing with a duplicate-registration error.
//
// # Logs
//
// Every line is written to the logger of WithLogger, named "idempotency", and
// carries the operation and, as WithLogKeys says, the key, its hash
// (the default) or neither; unless the key is logged plain, it is also
// replaced in error messages. Error lines carry error_type, the store method
// when there is one, and the error. Routine events (hit, miss, stored, each
// store call, a collision) are logged at Debug, an unprotected run,
// a wait timeout, a failed lease renewal and a key reuse at Warn, and the
// other errors at Error.
//
// docs/observability.md in the repository lists every metric, label value,
// bucket and log line, and the alerts worth setting.
package observability
