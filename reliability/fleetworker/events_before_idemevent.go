//go:build idemkit_before_idemevent

package main

import (
	"github.com/idemkit/idempotency/coordinator"
)

// The coordinator's events as the releases before issue 43 named them, in
// the package coordinator; see events.go.
type (
	event         = coordinator.Event
	eventObserver = coordinator.Observer
)

const (
	kindUnprotected = coordinator.EventUnprotected
	kindStored      = coordinator.EventStored
	kindError       = coordinator.EventError
	kindStorageCall = coordinator.EventStorageCall
)
