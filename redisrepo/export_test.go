package redisrepo

import "time"

// HashSlot exports hashSlot to the tests.
var HashSlot = hashSlot

// FormatVersion exports formatVersion to the tests.
const FormatVersion = formatVersion

// SetSightingsClock makes s's sightings (see abandon) read now instead of
// the wall clock; call it before s is used.
func SetSightingsClock(s *Store, now func() time.Time) { s.seen.now = now }

// Format returns the record format s writes.
func (s *Store) Format() RecordFormat { return s.format }

// MaxPipeline is maxPipeline, for the tests of the bound.
const MaxPipeline = maxPipeline
