package redisrepo

import (
	"fmt"
	"testing"
	"time"
)

// TestSightingsDue: a record met for the first time is never due; the same
// record met again is due once an interval (at most maxCheckEvery) after
// the first meeting or the last check; another token under the key starts
// over; a full memory forgets every key instead of growing.
func TestSightingsDue(t *testing.T) {
	now := time.Unix(0, 0)
	g := newSightings()
	g.now = func() time.Time { return now }
	step := func(d time.Duration, key, token string, every time.Duration, want bool) {
		t.Helper()
		now = now.Add(d)
		if got := g.due(key, token, every); got != want {
			t.Errorf("at %v, due(%q, %q, %v) = %v, want %v", now.Sub(time.Unix(0, 0)), key, token, every, got, want)
		}
	}
	step(0, "k", "a", time.Second, false)                    // first meeting
	step(999*time.Millisecond, "k", "a", time.Second, false) // within the interval
	step(time.Millisecond, "k", "a", time.Second, true)      // one interval after the first
	step(time.Millisecond, "k", "a", time.Second, false)     // checked: the next is an interval later
	step(0, "k", "b", time.Second, false)                    // another holder: starts over
	step(time.Second, "k", "b", time.Second, true)
	step(0, "long", "a", time.Hour, false)
	step(maxCheckEvery, "long", "a", time.Hour, true) // a long lease is checked every maxCheckEvery

	for i := range maxSightings + 1 {
		g.due(fmt.Sprint("fill-", i), "t", time.Second)
	}
	n := 0
	g.m.Range(func(any, any) bool { n++; return true })
	if n > maxSightings {
		t.Errorf("%d sightings kept, want at most %d", n, maxSightings)
	}
}
