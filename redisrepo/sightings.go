package redisrepo

import (
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// sightings remembers, by Redis key, the pending record that Reserve last
// met there and since when, so that a collision checks a record for an
// expiry (abandon.lua) only when this Store keeps meeting the same pending
// record: a collision's first meeting, and every meeting within one
// interval of the last check, costs no second round trip. The interval only
// decides when to look; whether a record is wedged is decided on the server
// by the record alone (it has no expiry), never by this process's lease.
//
// Many callers meet one hot key at once (a burst of retries): a meeting that
// is not due reads without a lock.
type sightings struct {
	m   sync.Map     // Redis key → *sighting
	n   atomic.Int64 // entries in m, about
	now func() time.Time
}

// sighting is a pending record met under a key: its token, and when it was
// first met or last checked (now's Unix nanoseconds).
type sighting struct {
	token string
	since atomic.Int64
}

// maxSightings bounds the memory of sightings: when it is full, it forgets
// every key (a key met again is then checked one interval later).
const maxSightings = 4096

// maxCheckEvery bounds the interval between two checks of one pending
// record, for a Store whose callers run with long leases or write without
// one.
const maxCheckEvery = 30 * time.Second

func newSightings() *sightings {
	return &sightings{now: time.Now}
}

// due reports whether Reserve, having met the pending record with token
// under rkey, should check it for an expiry now: it has met that record
// before, every (at most maxCheckEvery) or longer ago, and not checked it
// since. Otherwise it notes the meeting and reports false. Of callers that
// find one record due at once, one is told so.
func (g *sightings) due(rkey, token string, every time.Duration) bool {
	every = min(every, maxCheckEvery)
	now := g.now().UnixNano()
	if v, ok := g.m.Load(rkey); ok {
		s := v.(*sighting)
		if s.token == token {
			since := s.since.Load()
			return now-since >= int64(every) && s.since.CompareAndSwap(since, now)
		}
	}
	if g.n.Load() >= maxSightings {
		g.m.Clear()
		g.n.Store(0)
	}
	// rkey and token alias a command's buffer and a reply: keep copies.
	s := &sighting{token: strings.Clone(token)}
	s.since.Store(now)
	if _, loaded := g.m.Swap(strings.Clone(rkey), s); !loaded {
		g.n.Add(1)
	}
	return false
}
