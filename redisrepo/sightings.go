package redisrepo

import (
	"strings"
	"sync"
	"time"
)

// sightings remembers, by Redis key, the pending record that Reserve last
// met there and since when, so that a collision checks a record for an
// expiry (abandon.lua) only when this Store keeps meeting the same pending
// record: a collision's first meeting, and every meeting within one
// interval of the last check, costs no second round trip. The interval only
// decides when to look; whether a record is wedged is decided on the server
// by the record alone (it has no expiry), never by this process's lease.
type sightings struct {
	mu  sync.Mutex
	m   map[string]sighting
	now func() time.Time
}

// sighting is a pending record met under a key: its token, and when it was
// first met or last checked.
type sighting struct {
	token string
	since time.Time
}

// maxSightings bounds the memory of sightings: when it is full, it forgets
// every key (a key met again is then checked one interval later).
const maxSightings = 4096

// maxCheckEvery bounds the interval between two checks of one pending
// record, for a Store whose callers run with long leases or write without
// one.
const maxCheckEvery = 30 * time.Second

func newSightings() *sightings {
	return &sightings{m: make(map[string]sighting), now: time.Now}
}

// due reports whether Reserve, having met the pending record with token
// under rkey, should check it for an expiry now: it has met that record
// before, every (at most maxCheckEvery) or longer ago, and not checked it
// since. Otherwise it notes the meeting and reports false.
func (g *sightings) due(rkey, token string, every time.Duration) bool {
	every = min(every, maxCheckEvery)
	now := g.now()
	g.mu.Lock()
	defer g.mu.Unlock()
	if s, ok := g.m[rkey]; ok && s.token == token {
		if now.Sub(s.since) < every {
			return false
		}
		g.m[rkey] = sighting{token: s.token, since: now}
		return true
	}
	if len(g.m) >= maxSightings {
		clear(g.m)
	}
	// rkey and token alias a command's buffer and a reply: keep copies.
	g.m[strings.Clone(rkey)] = sighting{token: strings.Clone(token), since: now}
	return false
}
