package redistest

import (
	"context"
	"strconv"
	"strings"
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
		t.Setenv(EnvServer, "")
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
	ServerBinary(t)
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

// TestParseServerVersion reads the --version of the servers this package
// runs, and refuses what is not one.
func TestParseServerVersion(t *testing.T) {
	for _, tt := range []struct {
		out              string
		product, version string // "" when it is refused
	}{
		{"Redis server v=7.0.15 sha=00000000:0 malloc=jemalloc-5.3.0 bits=64 build=e08dbad3e06f3fb\n", "Redis", "7.0.15"},
		{"Valkey server v=8.0.1 sha=00000000:1 malloc=jemalloc-5.3.0 bits=64 build=9a67693a1e25d77e\n", "Valkey", "8.0.1"},
		{"Redis server v=255.255.255 sha=0\n", "Redis", "255.255.255"},
		{"", "", ""},
		{"hello\n", "", ""},
		{"valkey-cli 8.0.1\n", "", ""},
		{"Redis server\n", "", ""},
		{"Redis server v= sha=0\n", "", ""},
		{"KeyDB server v=6.3.4 sha=0\n", "", ""},
		{"Redis client v=7.0.15\n", "", ""},
	} {
		b, err := parseServerVersion(tt.out)
		if tt.product == "" {
			if err == nil || !strings.Contains(err.Error(), "not a Redis or Valkey server") {
				t.Errorf("parseServerVersion(%q) = %+v, %v; want an error", tt.out, b, err)
			}
			continue
		}
		if err != nil || b.Product != tt.product || b.Version != tt.version {
			t.Errorf("parseServerVersion(%q) = %+v, %v; want %s %s", tt.out, b, err, tt.product, tt.version)
		}
	}
}
