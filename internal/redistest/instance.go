package redistest

import (
	"errors"
	"testing"

	"github.com/redis/go-redis/v9"
)

// Instance is a standalone Redis server of one test's own, which the test may
// stop and start again on the same address: to see what a store does when
// Redis goes away mid-call and comes back. Start one with Start.
type Instance struct {
	kind    Kind
	addr    string
	dir     string
	port    int
	proc    *proc // the redis-server while it runs
	mini    *mini // the miniredis fallback
	stopped bool  // the miniredis is stopped
}

// Start starts a standalone Redis server for t alone and stops it when t
// ends: a redis-server process on a free port, or miniredis (with its keys
// expiring in real time) when there is no redis-server binary, which it
// logs; with EnvRequire set that is a test failure instead. EnvURL does not
// apply: a test cannot stop a server it did not start.
func Start(t testing.TB) *Instance {
	t.Helper()
	b, err := findServer()
	if err != nil {
		if !errors.Is(err, errNoDefault) {
			t.Fatalf("redistest: %v", err)
		}
		if required() {
			t.Fatalf("redistest: %s=1 but %v", EnvRequire, err)
		}
		t.Log(fallbackMessage)
		m, err := startMiniredis(true)
		if err != nil {
			t.Fatalf("redistest: %v", err)
		}
		t.Cleanup(m.close)
		return &Instance{kind: KindMiniredis, mini: m, addr: m.m.Addr()}
	}
	logServer(t, b)
	in := &Instance{kind: KindRedisServer, dir: t.TempDir()}
	p, err := startServer(in.dir, 0)
	if err != nil {
		t.Fatalf("redistest: %v", err)
	}
	in.proc, in.port, in.addr = p, p.port, p.addr()
	t.Cleanup(func() {
		if in.proc != nil {
			in.proc.kill()
		}
	})
	return in
}

// Kind returns KindRedisServer or KindMiniredis.
func (in *Instance) Kind() Kind { return in.kind }

// Addr returns the server's address, host:port; it stays the same across
// Stop and Restart.
func (in *Instance) Addr() string { return in.addr }

// Options returns the options of a client of the server.
func (in *Instance) Options() *redis.Options {
	return &redis.Options{Addr: in.Addr()}
}

// Client returns a new client of the server, closed when t ends.
func (in *Instance) Client(t testing.TB) *redis.Client {
	t.Helper()
	return newClient(t, in.Options())
}

// Stop kills the server (SIGKILL: no shutdown, no save), as a crash would,
// and returns once it has exited. A redis-server loses its data (miniredis
// keeps it). Stopping a stopped server does nothing.
func (in *Instance) Stop(t testing.TB) {
	t.Helper()
	if in.mini != nil {
		if !in.stopped {
			in.mini.m.Close()
			in.stopped = true
		}
		return
	}
	if in.proc != nil {
		in.proc.kill()
		in.proc = nil
	}
}

// Restart starts a stopped server again on the same address, and returns
// once it answers PING. Restarting a running server does nothing.
func (in *Instance) Restart(t testing.TB) {
	t.Helper()
	if in.mini != nil {
		if in.stopped {
			if err := in.mini.m.Restart(); err != nil {
				t.Fatalf("redistest: restart miniredis: %v", err)
			}
			in.stopped = false
		}
		return
	}
	if in.proc != nil {
		return
	}
	p, err := startServer(in.dir, in.port)
	if err != nil {
		t.Fatalf("redistest: restart redis-server: %v", err)
	}
	in.proc = p
}
