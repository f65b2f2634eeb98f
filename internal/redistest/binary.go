package redistest

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
)

// The default binaries, looked up on PATH when EnvServer and EnvCLI are
// unset.
const (
	defaultServer = "redis-server"
	defaultCLI    = "redis-cli"
)

// Binary is the server or CLI binary this package runs, as it was found.
type Binary struct {
	// Path is the binary's path.
	Path string
	// Product is what its --version names: "Redis" or "Valkey" (a
	// server's only; the CLI's is empty).
	Product string
	// Version is the release its --version names, 8.0.1 (a server's only).
	Version string
}

// String returns the binary's product, version and path, for a log line:
// "Valkey 8.0.1 (/path/to/valkey-server)".
func (b Binary) String() string {
	if b.Product == "" {
		return b.Path
	}
	return b.Product + " " + b.Version + " (" + b.Path + ")"
}

// errNoDefault says that the default server or CLI, which the environment
// did not name, is not on PATH: the one case where Server and Start fall
// back to miniredis and the others skip (unless EnvRequire is set).
var errNoDefault = errors.New("not on PATH")

// findServer returns the server binary: EnvServer, a path or a name looked
// up on PATH, or redis-server on PATH. It returns an error that wraps
// errNoDefault when EnvServer is unset and there is no redis-server, and
// another error, which fails a test whatever EnvRequire says, when EnvServer
// names a binary that is missing or is not a Redis or Valkey server.
func findServer() (Binary, error) {
	name := strings.TrimSpace(os.Getenv(EnvServer))
	if name == "" {
		path, err := exec.LookPath(defaultServer)
		if err != nil {
			return Binary{}, fmt.Errorf("%s: %w", defaultServer, errNoDefault)
		}
		return serverVersion(path)
	}
	path, err := exec.LookPath(name)
	if err != nil {
		return Binary{}, fmt.Errorf("%s=%s: %w", EnvServer, name, err)
	}
	b, err := serverVersion(path)
	if err != nil {
		return Binary{}, fmt.Errorf("%s=%s: %w", EnvServer, name, err)
	}
	return b, nil
}

// findCLI returns the CLI binary: EnvCLI, a path or a name looked up on
// PATH; else, when EnvServer names a server, the CLI beside it (the same
// folder, "server" replaced by "cli" in the name: valkey-server's
// valkey-cli); else redis-cli on PATH. Its errors are those of findServer.
func findCLI() (Binary, error) {
	if name := strings.TrimSpace(os.Getenv(EnvCLI)); name != "" {
		path, err := exec.LookPath(name)
		if err != nil {
			return Binary{}, fmt.Errorf("%s=%s: %w", EnvCLI, name, err)
		}
		return Binary{Path: path}, nil
	}
	if os.Getenv(EnvServer) == "" {
		path, err := exec.LookPath(defaultCLI)
		if err != nil {
			return Binary{}, fmt.Errorf("%s: %w", defaultCLI, errNoDefault)
		}
		return Binary{Path: path}, nil
	}
	server, err := findServer()
	if err != nil {
		return Binary{}, err
	}
	dir, base := filepath.Split(server.Path)
	if !strings.Contains(base, "server") {
		return Binary{}, fmt.Errorf("%s=%s: no CLI beside a server whose name has no \"server\" in it: set %s",
			EnvServer, os.Getenv(EnvServer), EnvCLI)
	}
	cli := filepath.Join(dir, strings.Replace(base, "server", "cli", 1))
	path, err := exec.LookPath(cli)
	if err != nil {
		return Binary{}, fmt.Errorf("%s=%s: the CLI beside it: %w (set %s)", EnvServer, os.Getenv(EnvServer), err, EnvCLI)
	}
	return Binary{Path: path}, nil
}

// versions caches what serverVersion read, by path: each server binary's
// --version runs once per test binary.
var versions sync.Map // path -> Binary

// serverVersion runs path --version and reads its product and release from
// the reply: "Redis server v=7.0.15 sha=..." or "Valkey server v=8.0.1
// sha=...".
func serverVersion(path string) (Binary, error) {
	if b, ok := versions.Load(path); ok {
		return b.(Binary), nil
	}
	out, err := exec.Command(path, "--version").Output()
	if err != nil {
		return Binary{}, fmt.Errorf("%s --version: %w", path, err)
	}
	b, err := parseServerVersion(string(out))
	if err != nil {
		return Binary{}, fmt.Errorf("%s --version: %w", path, err)
	}
	b.Path = path
	versions.Store(path, b)
	return b, nil
}

// parseServerVersion reads the product and release of a server's
// --version.
func parseServerVersion(out string) (Binary, error) {
	fields := strings.Fields(out)
	if len(fields) >= 3 && fields[1] == "server" && strings.HasPrefix(fields[2], "v=") {
		switch product, v := fields[0], strings.TrimPrefix(fields[2], "v="); {
		case (product == "Redis" || product == "Valkey") && v != "":
			return Binary{Product: product, Version: v}, nil
		}
	}
	first, _, _ := strings.Cut(strings.TrimSpace(out), "\n")
	return Binary{}, fmt.Errorf("not a Redis or Valkey server: its version is %q, want \"Redis server v=...\" or \"Valkey server v=...\"", first)
}

// serverPath returns the server binary's path for a package function with
// no test at hand (StartProcess, the shared servers), or an error.
func serverPath() (string, error) {
	b, err := findServer()
	return b.Path, err
}

// logged makes the server binary's log line appear once per test binary.
var logged atomic.Bool

// logServer logs which server binary the tests run on, once per test binary
// (in the first test that starts one).
func logServer(t testing.TB, b Binary) {
	t.Helper()
	if logged.CompareAndSwap(false, true) {
		t.Logf("redistest: tests run on %s", b)
	}
}

// needBinary returns the binary find finds, or ends t: a failure when the
// environment named a binary that is not there or is not a server, or when
// EnvRequire is set; a skip that says why, and what would run it, otherwise.
func needBinary(t testing.TB, find func() (Binary, error), why string) Binary {
	t.Helper()
	b, err := find()
	switch {
	case err == nil:
		return b
	case !errors.Is(err, errNoDefault):
		t.Fatalf("redistest: %v", err)
	case required():
		t.Fatalf("redistest: %s=1 but %v: %s", EnvRequire, err, why)
	default:
		t.Skipf("redistest: %v: skipping: %s (install redis-server and redis-cli, or set %s to a server binary)", err, why, EnvServer)
	}
	return Binary{}
}

// ServerBinary returns the server binary that this package starts: the one
// EnvServer names, or redis-server on PATH. It logs which (once per test
// binary). It fails t when EnvServer names a binary that is missing or is
// not a Redis or Valkey server; without EnvServer and redis-server it skips
// t, or fails it when EnvRequire is set. For tests that start servers of
// their own.
func ServerBinary(t testing.TB) Binary {
	t.Helper()
	b := needBinary(t, findServer, "the test starts Redis server processes of its own")
	logServer(t, b)
	return b
}

// CLIBinary returns the CLI binary that goes with ServerBinary's server:
// the one EnvCLI names, else the CLI beside EnvServer's server
// (valkey-server's valkey-cli), else redis-cli on PATH. It ends t as
// ServerBinary does. For tests that join a cluster of their own (CLI
// --cluster create).
func CLIBinary(t testing.TB) Binary {
	t.Helper()
	return needBinary(t, findCLI, "the test needs the CLI (--cluster create)")
}
