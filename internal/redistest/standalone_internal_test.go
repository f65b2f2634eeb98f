package redistest

import (
	"context"
	"strconv"
	"testing"

	"github.com/alicebob/miniredis/v2"
)

// TestStandaloneSources checks where the shared standalone server comes
// from: EnvURL, else redis-server, else miniredis.
func TestStandaloneSources(t *testing.T) {
	ctx := context.Background()
	t.Setenv(EnvURL, "")
	t.Run("URL", func(t *testing.T) {
		own, err := startStandalone()
		if err != nil {
			t.Fatal(err)
		}
		defer own.stop()
		t.Setenv(EnvURL, "redis://"+own.opts.Addr+"/2")
		s, err := startStandalone()
		if err != nil {
			t.Fatal(err)
		}
		defer s.stop()
		if s.kind != KindExternal || s.opts.Addr != own.opts.Addr || s.opts.DB != 2 {
			t.Errorf("with %s: kind %s, addr %s, db %d", EnvURL, s.kind, s.opts.Addr, s.opts.DB)
		}
	})
	t.Run("unreachable URL", func(t *testing.T) {
		t.Setenv(EnvURL, "redis://127.0.0.1:1/0")
		if s, err := startStandalone(); err == nil {
			s.stop()
			t.Error("an unreachable server: nil error")
		}
	})
	t.Run("no binary", func(t *testing.T) {
		t.Setenv("PATH", t.TempDir())
		s, err := startStandalone()
		if err != nil {
			t.Fatal(err)
		}
		defer s.stop()
		if s.kind != KindMiniredis {
			t.Errorf("without redis-server: kind %s, want miniredis", s.kind)
		}
		c := newClient(t, &s.opts)
		if err := c.Ping(ctx).Err(); err != nil {
			t.Error(err)
		}
	})
}

// A redis-server that cannot bind its port exits; spawn must not take the
// server that holds the port for its own.
func TestSpawnRefusesAForeignServer(t *testing.T) {
	if !haveBinary("redis-server") {
		t.Skip("redistest: no redis-server on PATH: nothing to spawn")
	}
	port, err := freePort(false)
	if err != nil {
		t.Fatal(err)
	}
	foreign := miniredis.NewMiniRedis()
	if err := foreign.StartAddr("127.0.0.1:" + strconv.Itoa(port)); err != nil {
		t.Skipf("could not take port %d: %v", port, err)
	}
	defer foreign.Close()
	p, err := spawn(t.TempDir(), port, nil)
	if err == nil {
		p.kill()
		t.Fatal("spawn succeeded on a port another server holds")
	}
}
