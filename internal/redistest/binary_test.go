package redistest_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/idemkit/idempotency/internal/redistest"
)

// fakeBinary writes an executable shell script named name in dir that
// prints out, and returns its path.
func fakeBinary(t *testing.T, dir, name, out string) string {
	t.Helper()
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, []byte("#!/bin/sh\necho '"+out+"'\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestBinaryFromEnv: EnvServer chooses the server binary, whose --version
// names the product and release, and the CLI beside it; EnvCLI overrides
// the CLI.
func TestBinaryFromEnv(t *testing.T) {
	dir := t.TempDir()
	server := fakeBinary(t, dir, "valkey-server", "Valkey server v=8.0.1 sha=00000000:1 malloc=jemalloc-5.3.0 bits=64 build=9a67693a1e25d77e")
	cli := fakeBinary(t, dir, "valkey-cli", "valkey-cli 8.0.1")
	t.Setenv(redistest.EnvServer, server)
	t.Setenv(redistest.EnvCLI, "")

	b := redistest.ServerBinary(t)
	if b.Path != server || b.Product != "Valkey" || b.Version != "8.0.1" {
		t.Errorf("ServerBinary = %+v, want Valkey 8.0.1 at %s", b, server)
	}
	if want := "Valkey 8.0.1 (" + server + ")"; b.String() != want {
		t.Errorf("String = %q, want %q", b, want)
	}
	if got := redistest.CLIBinary(t).Path; got != cli {
		t.Errorf("CLIBinary = %s, want the CLI beside the server, %s", got, cli)
	}

	other := fakeBinary(t, t.TempDir(), "my-cli", "")
	t.Setenv(redistest.EnvCLI, other)
	if got := redistest.CLIBinary(t).Path; got != other {
		t.Errorf("CLIBinary with %s = %s, want %s", redistest.EnvCLI, got, other)
	}

	// A name without a folder is looked up on PATH.
	t.Setenv("PATH", dir)
	t.Setenv(redistest.EnvServer, "valkey-server")
	t.Setenv(redistest.EnvCLI, "")
	if b := redistest.ServerBinary(t); b.Path != server {
		t.Errorf("ServerBinary with %s=valkey-server = %s, want %s", redistest.EnvServer, b.Path, server)
	}
	if got := redistest.CLIBinary(t).Path; got != cli {
		t.Errorf("CLIBinary = %s, want %s", got, cli)
	}
}

// TestBinaryFromEnvInvalid: a server or CLI the environment names that is
// missing, is not executable, or is not a Redis or Valkey server fails every
// helper that starts a server, with a message that names the variable, even
// without EnvRequire: a choice that was made is never swapped for miniredis
// or a skip.
func TestBinaryFromEnvInvalid(t *testing.T) {
	t.Setenv(redistest.EnvRequire, "")
	t.Setenv(redistest.EnvURL, "")
	t.Setenv(redistest.EnvClusterAddrs, "")
	dir := t.TempDir()
	notExec := filepath.Join(dir, "plain-server")
	if err := os.WriteFile(notExec, []byte("#!/bin/sh\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	lone := t.TempDir() // a server with no CLI beside it
	loneServer := fakeBinary(t, lone, "valkey-server", "Valkey server v=8.0.1 sha=0")
	noName := fakeBinary(t, t.TempDir(), "kv", "Valkey server v=8.0.1 sha=0")
	helpers := map[string]func(tb *recorder){
		"ServerBinary":  func(tb *recorder) { redistest.ServerBinary(tb) },
		"Server":        func(tb *recorder) { redistest.Server(tb) },
		"Start":         func(tb *recorder) { redistest.Start(tb) },
		"Cluster":       func(tb *recorder) { redistest.Cluster(tb) },
		"StartSentinel": func(tb *recorder) { redistest.StartSentinel(tb) },
	}
	for _, tt := range []struct {
		name, server, cli string
		want              string // in the failure message
		only              string // the helper that fails, when not all of them
	}{
		{name: "missing server", server: filepath.Join(dir, "no-such-server"), want: "no such file"},
		{name: "server not on PATH", server: "no-such-server-xyz", want: "executable file not found"},
		{name: "not executable", server: notExec, want: "permission denied"},
		{name: "not a server", server: fakeBinary(t, dir, "true-server", "hello"), want: "not a Redis or Valkey server"},
		{name: "empty version", server: fakeBinary(t, dir, "empty-server", ""), want: "not a Redis or Valkey server"},
		{name: "no CLI beside the server", server: loneServer, want: redistest.EnvCLI, only: "Cluster"},
		{name: "no CLI name to derive", server: noName, want: redistest.EnvCLI, only: "Cluster"},
		{name: "missing CLI", server: loneServer, cli: filepath.Join(dir, "no-such-cli"), want: redistest.EnvCLI, only: "Cluster"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Setenv(redistest.EnvServer, tt.server)
			t.Setenv(redistest.EnvCLI, tt.cli)
			for name, fn := range helpers {
				if tt.only != "" && name != tt.only {
					continue
				}
				r := run(t, fn)
				if !r.failed || !strings.Contains(r.msg, tt.want) {
					t.Errorf("%s: failed %v, %q; want a failure that says %q", name, r.failed, r.msg, tt.want)
				}
			}
			if tt.only == "Cluster" {
				r := run(t, func(tb *recorder) { redistest.CLIBinary(tb) })
				if !r.failed || !strings.Contains(r.msg, tt.want) {
					t.Errorf("CLIBinary: failed %v, %q; want a failure that says %q", r.failed, r.msg, tt.want)
				}
			}
		})
	}
}

// TestServerVersionMatchesInfo: the version ServerBinary reports, and logs,
// is the one the running server reports in INFO server (valkey_version for
// Valkey, whose redis_version is the Redis release it is compatible with).
func TestServerVersionMatchesInfo(t *testing.T) {
	if redistest.ServerKind(t) != redistest.KindRedisServer {
		t.Skip("the shared server is not one this package started")
	}
	b := redistest.ServerBinary(t)
	info, err := redistest.Server(t).Info(context.Background(), "server").Result()
	if err != nil {
		t.Fatal(err)
	}
	field := "redis_version:"
	if b.Product == "Valkey" {
		field = "valkey_version:"
	}
	if want := field + b.Version + "\r\n"; !strings.Contains(info, want) {
		t.Errorf("ServerBinary says %s; INFO server has no %q:\n%s", b, want, info)
	}
	t.Logf("%s; INFO server: %s", b, strings.Join(strings.Fields(info)[1:4], " "))
}
