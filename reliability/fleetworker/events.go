//go:build !idemkit_before_idemevent

package main

import (
	"github.com/idemkit/idempotency/coordinator/idemevent"
)

// The coordinator's events as this release names them (coordinator/idemevent,
// issue 43). events_before_idemevent.go names them as the releases before it
// did, so that this worker's source builds against the previous release too
// (TestFleetUpgrade builds it with the tag idemkit_before_idemevent).
type (
	event         = idemevent.Event
	eventObserver = idemevent.Observer
)

const (
	kindUnprotected = idemevent.Unprotected
	kindStored      = idemevent.Stored
	kindError       = idemevent.Error
	kindStorageCall = idemevent.StorageCall
)
