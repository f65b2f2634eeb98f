package redistest

import (
	"sync"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
)

// Miniredis starts a miniredis of t's own, stopped when t ends, and returns
// a client of it (closed when t ends) and the server, whose clock the test
// moves with FastForward: its keys do not expire by themselves. Use it for
// tests that run against miniredis on purpose; Server falls back to
// miniredis by itself when there is no redis-server.
func Miniredis(t testing.TB) (*redis.Client, *miniredis.Miniredis) {
	t.Helper()
	m, err := startMiniredis(false)
	if err != nil {
		t.Fatalf("redistest: %v", err)
	}
	t.Cleanup(m.close)
	return newClient(t, &redis.Options{Addr: m.m.Addr()}), m.m
}

// mini is a running miniredis, with the goroutine that makes its keys expire
// in real time when it has one.
type mini struct {
	m    *miniredis.Miniredis
	stop chan struct{}
	wg   sync.WaitGroup
	once sync.Once
}

// clockTick is how often a real-time miniredis moves its clock.
const clockTick = 5 * time.Millisecond

// startMiniredis starts a miniredis. With realTime, a goroutine moves its
// clock forward with the wall clock, so that keys expire as they would on
// Redis; close stops it.
func startMiniredis(realTime bool) (*mini, error) {
	m, err := miniredis.Run()
	if err != nil {
		return nil, err
	}
	mr := &mini{m: m, stop: make(chan struct{})}
	if realTime {
		mr.wg.Add(1)
		go mr.tick()
	}
	return mr, nil
}

func (mr *mini) tick() {
	defer mr.wg.Done()
	t := time.NewTicker(clockTick)
	defer t.Stop()
	last := time.Now()
	for {
		select {
		case <-mr.stop:
			return
		case now := <-t.C:
			mr.m.FastForward(now.Sub(last))
			last = now
		}
	}
}

func (mr *mini) close() {
	mr.once.Do(func() {
		close(mr.stop)
		mr.wg.Wait()
		mr.m.Close()
	})
}
