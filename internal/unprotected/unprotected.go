// Package unprotected is the bridge by which the library's adapters report
// a call that runs without a key (no Idempotency-Key header, no key
// metadata) as unprotected, so that metrics count what Do never saw. The
// coordinator sets Report when it is initialised; being internal, the
// bridge lets no code outside the library report an event. It imports the
// standard library only, as the coordinator does.
package unprotected

import "context"

// Report reports an idemevent.Unprotected event (Method
// idemevent.MethodNone) on c, a *coordinator.Coordinator, for an action of
// operation that runs without a key. It reports nothing when the kill
// switch is off or operation is invalid.
var Report func(c any, ctx context.Context, operation string)
