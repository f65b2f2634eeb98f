package memstore

import "time"

// Option configures a Store; pass options to New. A nil Option is skipped.
// Every option value is accepted, so New cannot fail.
type Option interface{ apply(*config) }

type optionFunc func(*config)

func (f optionFunc) apply(c *config) { f(c) }

type config struct {
	now func() time.Time
}

// WithClock sets the clock that decides when leases and time to live run
// out. Default time.Now; nil also means time.Now. In tests, pass the Now
// method of a FakeClock.
func WithClock(now func() time.Time) Option {
	return optionFunc(func(c *config) { c.now = now })
}
