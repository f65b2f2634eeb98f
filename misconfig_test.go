package idempotency_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"maps"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/fx"
	"go.uber.org/fx/fxtest"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/coordinator"
	"github.com/idemkit/idempotency/coordinator/memstore"
	"github.com/idemkit/idempotency/internal/redistest"
	"github.com/idemkit/idempotency/observability"
)

// redisProc starts a redis-server of the test's own with the extra
// arguments, on a free port, and returns its port once it accepts
// connections; it is killed when the test ends. The test is skipped without
// a redis-server binary (redistest.ServerBinary, which also picks the binary).
func redisProc(t *testing.T, extra ...string) int {
	t.Helper()
	port, err := startRedisProc(t, extra...)
	if err != nil {
		t.Fatal(err)
	}
	return port
}

// startRedisProc is redisProc, returning an error, with the server's log,
// when the server exits or does not listen.
func startRedisProc(t *testing.T, extra ...string) (int, error) {
	t.Helper()
	bin := redistest.ServerBinary(t).Path
	port := freePort(t)
	dir := t.TempDir()
	args := append([]string{"--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", dir,
		"--logfile", filepath.Join(dir, "redis.log")}, extra...)
	if !slicesContain(extra, "--port") {
		args = append(args, "--port", strconv.Itoa(port))
	}
	args = replacePort(args, port)
	cmd := exec.Command(bin, args...)
	if err := cmd.Start(); err != nil {
		return 0, err
	}
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(exited)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
	})
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	deadline := time.Now().Add(10 * time.Second)
	for {
		conn, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			_ = conn.Close()
			return port, nil
		}
		log, _ := os.ReadFile(filepath.Join(dir, "redis.log"))
		select {
		case <-exited:
			return 0, fmt.Errorf("%s %v exited:\n%s", bin, args, log)
		default:
		}
		if time.Now().After(deadline) {
			return 0, fmt.Errorf("%s %v does not listen: %v\n%s", bin, args, err, log)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// portPlaceholder in redisProc's arguments is replaced by the port it picks.
const portPlaceholder = "{port}"

func replacePort(args []string, port int) []string {
	for i, a := range args {
		if a == portPlaceholder {
			args[i] = strconv.Itoa(port)
		}
	}
	return args
}

func slicesContain(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// selfSigned writes a self-signed certificate for 127.0.0.1 and its key into
// a temporary directory and returns their paths.
func selfSigned(t *testing.T) (certFile, keyFile string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1),
		Subject:      pkix.Name{CommonName: "idempotency test"},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1)},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	certFile, keyFile = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), 0o600); err != nil {
		t.Fatal(err)
	}
	return certFile, keyFile
}

// tlsRedis starts a redis-server that speaks TLS only, and returns its
// address, or "" and why when the server binary was built without TLS
// (Valkey as tools/build-valkey.sh builds it, BUILD_TLS=no).
func tlsRedis(t *testing.T) (addr, noTLS string) {
	t.Helper()
	cert, key := selfSigned(t)
	port, err := startRedisProc(t, "--port", "0", "--tls-port", portPlaceholder,
		"--tls-cert-file", cert, "--tls-key-file", key, "--tls-auth-clients", "no")
	if err != nil && strings.Contains(err.Error(), "Failed finding TLS support") {
		return "", redistest.ServerBinary(t).String() + " was built without TLS"
	}
	if err != nil {
		t.Fatal(err)
	}
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), ""
}

// startModule starts Module with env set, and returns the warnings it logged
// and the start-up error; a started app is stopped when the test ends.
func startModule(t *testing.T, env map[string]string) (*observer.ObservedLogs, error) {
	t.Helper()
	clearEnv(t)
	for k, v := range env {
		t.Setenv(k, v)
	}
	_, regOpt := registry()
	core, logs := observer.New(zap.WarnLevel)
	var c *coordinator.Coordinator
	app := fx.New(idempotency.Module, regOpt, fx.Supply(zap.New(core)), fx.NopLogger, fx.Populate(&c))
	if err := app.Err(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 15*time.Second)
	defer cancel()
	err := app.Start(ctx)
	if err == nil {
		t.Cleanup(func() { _ = app.Stop(context.Background()) })
	}
	return logs, err
}

// A misconfiguration fails start-up, naming the variable and the problem,
// and never the password; only an unreachable Redis is an outage.
func TestModuleStartUpRefusesAMisconfiguration(t *testing.T) {
	const secret = "s3cret-Passw0rd"
	pwPort := redisProc(t, "--requirepass", secret)
	pwAddr := "127.0.0.1:" + strconv.Itoa(pwPort)
	plainPort := redisProc(t)
	plainAddr := "127.0.0.1:" + strconv.Itoa(plainPort)
	tlsAddr, noTLS := tlsRedis(t)
	needsTLS := map[string]bool{"redis against a TLS server": true, "untrusted certificate": true, "TLS skipping verification": true}
	web := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, "not redis", http.StatusBadRequest)
	}))
	t.Cleanup(web.Close)
	webAddr := strings.TrimPrefix(web.URL, "http://")

	// A user who may only PING: start-up loads the store's scripts.
	admin := redis.NewClient(&redis.Options{Addr: pwAddr, Password: secret})
	t.Cleanup(func() { _ = admin.Close() })
	if err := admin.Do(t.Context(), "ACL", "SETUSER", "pinger", "on", ">"+secret+"-pinger", "~*", "+ping", "+hello", "+client").Err(); err != nil {
		t.Fatal(err)
	}

	for _, tc := range []struct {
		name string
		url  string
		want string // in the error; "" means start-up succeeds
	}{
		{"wrong password", "redis://:wrong-" + secret + "@" + pwAddr + "/0", "refused the credentials"},
		{"missing password", "redis://" + pwAddr + "/0", "refused the credentials"},
		{"wrong user", "redis://nobody:" + secret + "@" + pwAddr + "/0", "refused the credentials"},
		{"no permission", "redis://pinger:" + secret + "-pinger@" + pwAddr + "/0", "denied the user a permission"},
		{"wrong database", "redis://:" + secret + "@" + pwAddr + "/99", "has no database 99"},
		{"rediss against a plain server", "rediss://:" + secret + "@" + plainAddr + "/0", "does not speak TLS: use redis://"},
		{"redis against a TLS server", "redis://:" + secret + "@" + tlsAddr + "/0", "speaks TLS only: use rediss://"},
		{"untrusted certificate", "rediss://:" + secret + "@" + tlsAddr + "/0", "failed: tls: failed to verify certificate"},
		{"not redis", "redis://:" + secret + "@" + webAddr + "/0", "does not speak the Redis protocol"},
		{"TLS skipping verification", "rediss://" + tlsAddr + "/0?skip_verify=true", ""},
		{"right password", "redis://:" + secret + "@" + pwAddr + "/0", ""},
		{"unreachable", "redis://:" + secret + "@127.0.0.1:1/0", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if noTLS != "" && needsTLS[tc.name] {
				t.Skipf("needs a server that speaks TLS: %s", noTLS)
			}
			logs, err := startModule(t, map[string]string{"IDEMPOTENCY_REDIS_URL": tc.url})
			if tc.want == "" {
				if err != nil {
					t.Fatalf("start-up failed: %v", err)
				}
				for _, e := range logs.All() {
					if strings.Contains(e.Message+fmt.Sprint(e.ContextMap()), secret) {
						t.Fatalf("a warning shows the password: %+v", e)
					}
				}
				return
			}
			if err == nil {
				t.Fatalf("start-up succeeded, want %q; logged %v", tc.want, logs.All())
			}
			t.Log(err)
			if !strings.HasPrefix(err.Error(), "IDEMPOTENCY_REDIS_URL: ") || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want %q", err, tc.want)
			}
			for _, part := range []string{secret, secret[:6], secret[6:]} {
				if strings.Contains(err.Error(), part) {
					t.Fatalf("the error shows (part of) the password %q: %v", part, err)
				}
			}
		})
	}
}

// A Redis that starts refusing the credentials at run time (a password
// rotated before the service) answered: the call is not an outage, so even
// in mode run (the default) the action does not run unprotected. The call
// returns a *StorageError that matches ErrMisconfigured, and the log says
// what Redis refused, without the secret.
func TestModuleRefusedCredentialsAtRunTimeRunNothing(t *testing.T) {
	const secret = "run-time-s3cret"
	port := redisProc(t, "--requirepass", secret)
	addr := "127.0.0.1:" + strconv.Itoa(port)
	clearEnv(t)
	t.Setenv("IDEMPOTENCY_REDIS_URL", "redis://:"+secret+"@"+addr+"/0")
	_, regOpt := registry()
	core, logs := observer.New(zap.WarnLevel)
	var c *coordinator.Coordinator
	app := fxtest.New(t, idempotency.Module, regOpt, fx.Supply(zap.New(core)), fx.Populate(&c))
	app.RequireStart()

	admin := redis.NewClient(&redis.Options{Addr: addr, Password: secret})
	defer admin.Close()
	if err := admin.Do(t.Context(), "ACL", "SETUSER", "default", "resetpass", ">another-"+secret).Err(); err != nil {
		t.Fatal(err)
	}
	if err := admin.Do(t.Context(), "CLIENT", "KILL", "USER", "default", "SKIPME", "yes").Err(); err != nil {
		t.Fatal(err)
	}
	var runs atomic.Int64
	_, err := coordinator.Do(t.Context(), c, coordinator.Call{Operation: "op", Key: "refused"}, charge(&runs))
	var se *coordinator.StorageError
	if !errors.As(err, &se) || !errors.Is(err, coordinator.ErrMisconfigured) || !strings.Contains(err.Error(), "WRONGPASS") {
		t.Fatalf("Do = %v, want a *StorageError that matches ErrMisconfigured and shows Redis's WRONGPASS", err)
	}
	if strings.Contains(err.Error(), secret) {
		t.Fatalf("the error shows the password: %v", err)
	}
	if n := runs.Load(); n != 0 {
		t.Fatalf("the action ran %d times on a refusal, want 0", n)
	}
	app.RequireStop()
	refused := logs.FilterMessage("storage call failed: redis refused the credentials").Len()
	failed := logs.FilterMessageSnippet("storage call failed").Len()
	if refused == 0 || refused != failed {
		t.Fatalf("%d lines say the credentials were refused, of %d failed store calls; want every one; logged %v", refused, failed, logs.All())
	}
	if n := logs.FilterMessageSnippet("unprotected").Len(); n != 0 {
		t.Fatalf("%d lines about an unprotected run, want none; logged %v", n, logs.All())
	}
}

// With Sentinel the master's database is still IDEMPOTENCY_REDIS_URL's.
func TestModuleStartUpOnSentinelRefusesAWrongDatabase(t *testing.T) {
	sentinel := redistest.StartSentinel(t)
	_, err := startModule(t, map[string]string{
		"IDEMPOTENCY_REDIS_SENTINEL_MASTER": redistest.SentinelMaster,
		"IDEMPOTENCY_REDIS_SENTINEL_ADDRS":  strings.Join(sentinel.Addrs(), ","),
		"IDEMPOTENCY_REDIS_URL":             "redis://ignored:6379/99",
	})
	if err == nil || !strings.HasPrefix(err.Error(), "IDEMPOTENCY_REDIS_URL: ") || !strings.Contains(err.Error(), "has no database 99") {
		t.Fatalf("err = %v, want IDEMPOTENCY_REDIS_URL: ... has no database 99", err)
	}
	t.Log(err)
}

// Sentinels that answer but monitor no master of the name are a
// misconfiguration, not an outage: waiting does not teach them the name.
func TestModuleStartUpOnSentinelRefusesAnUnknownMaster(t *testing.T) {
	sentinel := redistest.StartSentinel(t)
	_, err := startModule(t, map[string]string{
		"IDEMPOTENCY_REDIS_SENTINEL_MASTER": "no-such-master",
		"IDEMPOTENCY_REDIS_SENTINEL_ADDRS":  strings.Join(sentinel.Addrs(), ","),
		"IDEMPOTENCY_REDIS_URL":             "redis://ignored:6379/0",
	})
	if err == nil || !strings.HasPrefix(err.Error(), "IDEMPOTENCY_REDIS_SENTINEL_MASTER: ") || !strings.Contains(err.Error(), `"no-such-master"`) {
		t.Fatalf("err = %v, want IDEMPOTENCY_REDIS_SENTINEL_MASTER: ... \"no-such-master\"", err)
	}
	t.Log(err)
}

// The coordinator and observability packages own the rules on their options
// and report a refused value as a *coordinator.OptionError naming the option;
// Settings.Validate names the variable behind it instead. These tests check
// that every such error reaches the user as "IDEMPOTENCY_<NAME>: ...", and
// that a new option cannot slip past the mapping.

// unsetOptions are the options Settings deliberately does not set: they carry
// what the app supplies (an observer, a logger, a registry), or a limit with
// no variable.
var unsetOptions = []string{"WithObserver", "WithLogger", "WithRegisterer", "WithOperationLimit"}

// cannotFail are the mapped options that have no invalid value.
var cannotFail = []string{"WithEnabled"}

var (
	variableLine = regexp.MustCompile(`^(IDEMPOTENCY_[A-Z_]+): \S`)
	optionName   = regexp.MustCompile(`\bWith[A-Z][A-Za-z]*`)
)

// errorLines returns the lines of a settings error after its header.
func errorLines(t *testing.T, err error) []string {
	t.Helper()
	lines := strings.Split(err.Error(), "\n")
	if lines[0] != "idempotency: invalid settings:" || len(lines) < 2 {
		t.Fatalf("error = %q; want the header and one line per problem", err)
	}
	return lines[1:]
}

// refusedOptions returns the names of the options of s that coordinator and
// observability refuse, as their *coordinator.OptionErrors report them.
func refusedOptions(s idempotency.Settings) []string {
	var names []string
	var walk func(error)
	walk = func(err error) {
		switch e := err.(type) {
		case nil:
		case *coordinator.OptionError: // observability reports this type too
			names = append(names, e.Option)
		case interface{ Unwrap() []error }:
			for _, e := range e.Unwrap() {
				walk(e)
			}
		case interface{ Unwrap() error }:
			walk(e.Unwrap())
		}
	}
	walk(coordinator.ValidateOptions(s.CoordinatorOptions()...))
	walk(observability.ValidateOptions(s.ObserverOptions()...))
	return names
}

func TestEveryOptionErrorNamesItsVariable(t *testing.T) {
	tests := []struct {
		name string
		// env is read by LoadSettings; without it, set changes
		// DefaultSettings, as code that builds Settings by hand does.
		env map[string]string
		set func(*idempotency.Settings)
		// want lists the variable of each line of the error, without the
		// prefix: a variable listed once must be named once.
		want []string
		// lines are lines the error must have, verbatim.
		lines []string
	}{
		{
			// Both pass a check on the values as given; rounded to the
			// millisecond, as the store takes them, the lease is 1ms.
			// Validate used to accept this, and NewCoordinator failed later
			// without naming a variable.
			name:  "LEASE 1.5ms with RENEW_INTERVAL 1.2ms",
			env:   map[string]string{"IDEMPOTENCY_LEASE": "1.5ms", "IDEMPOTENCY_RENEW_INTERVAL": "1.2ms"},
			want:  []string{"RENEW_INTERVAL"},
			lines: []string{"IDEMPOTENCY_RENEW_INTERVAL: must be shorter than IDEMPOTENCY_LEASE (1ms, rounded down from 1.5ms), got 1.2ms"},
		},
		{name: "LEASE zero", env: env("LEASE", "0s"), want: []string{"LEASE"}, lines: []string{"IDEMPOTENCY_LEASE: must be at least 1ms, got 0s"}},
		{name: "RENEW_INTERVAL negative", env: env("RENEW_INTERVAL", "-1s"), want: []string{"RENEW_INTERVAL"}},
		{name: "RENEW_INTERVAL equal to LEASE", env: env("RENEW_INTERVAL", "30s"), want: []string{"RENEW_INTERVAL"}, lines: []string{"IDEMPOTENCY_RENEW_INTERVAL: must be shorter than IDEMPOTENCY_LEASE (30s), got 30s"}},
		{name: "WAIT_TIMEOUT negative", env: env("WAIT_TIMEOUT", "-1s"), want: []string{"WAIT_TIMEOUT"}},
		{name: "POLL_INTERVAL zero", env: env("POLL_INTERVAL", "0s"), want: []string{"POLL_INTERVAL"}},
		{name: "STORAGE_TIMEOUT negative", env: env("STORAGE_TIMEOUT", "-1s"), want: []string{"STORAGE_TIMEOUT"}},
		{name: "MIN_TTL below 1ms", env: env("MIN_TTL", "999us"), want: []string{"MIN_TTL"}, lines: []string{"IDEMPOTENCY_MIN_TTL: must be at least 1ms, got 999µs"}},
		{
			// No DEFAULT_TTL lies within bounds that cross.
			name:  "MAX_TTL below MIN_TTL",
			env:   map[string]string{"IDEMPOTENCY_MIN_TTL": "2s", "IDEMPOTENCY_MAX_TTL": "1s", "IDEMPOTENCY_DEFAULT_TTL": "1s"},
			want:  []string{"MAX_TTL", "DEFAULT_TTL"},
			lines: []string{"IDEMPOTENCY_MAX_TTL: must not be shorter than IDEMPOTENCY_MIN_TTL (2s), got 1s"},
		},
		{
			name:  "DEFAULT_TTL below MIN_TTL",
			env:   env("DEFAULT_TTL", "500ms"),
			want:  []string{"DEFAULT_TTL"},
			lines: []string{"IDEMPOTENCY_DEFAULT_TTL: must be within IDEMPOTENCY_MIN_TTL and IDEMPOTENCY_MAX_TTL [1s, 720h0m0s], got 500ms"},
		},
		{
			name:  "DEFAULT_TTL above MAX_TTL",
			env:   map[string]string{"IDEMPOTENCY_MAX_TTL": "2h", "IDEMPOTENCY_DEFAULT_TTL": "3h"},
			want:  []string{"DEFAULT_TTL"},
			lines: []string{"IDEMPOTENCY_DEFAULT_TTL: must be within IDEMPOTENCY_MIN_TTL and IDEMPOTENCY_MAX_TTL [1s, 2h0m0s], got 3h0m0s"},
		},
		// The operations of OPERATION_TTLS are checked by the coordinator
		// (WithOperationTTLs) and by observability (WithOperations); each
		// problem is reported once.
		{
			name:  "OPERATION_TTLS invalid operation",
			env:   env("OPERATION_TTLS", "payment charge:1h"),
			want:  []string{"OPERATION_TTLS"},
			lines: []string{`IDEMPOTENCY_OPERATION_TTLS: operation "payment charge" has byte 0x20 at offset 7; only [A-Za-z0-9._-] is allowed`},
		},
		{
			name:  "FENCED_OPERATIONS invalid operation",
			env:   env("FENCED_OPERATIONS", "payment.charge,ledger post"),
			want:  []string{"FENCED_OPERATIONS"},
			lines: []string{`IDEMPOTENCY_FENCED_OPERATIONS: operation "ledger post" has byte 0x20 at offset 6; only [A-Za-z0-9._-] is allowed`},
		},
		{
			name:  "FENCED_OPERATIONS with record format 1",
			env:   map[string]string{"IDEMPOTENCY_FENCED_OPERATIONS": "payment.charge", "IDEMPOTENCY_RECORD_FORMAT": "1"},
			want:  []string{"FENCED_OPERATIONS"},
			lines: []string{"IDEMPOTENCY_FENCED_OPERATIONS: fences need IDEMPOTENCY_RECORD_FORMAT=2, and it is 1 (format 1 records have none): leave IDEMPOTENCY_FENCED_OPERATIONS empty until the rollout to format 2 is over"},
		},
		{
			name:  "REDIS_COALESCE_LANES negative",
			env:   env("REDIS_COALESCE_LANES", "-1"),
			want:  []string{"REDIS_COALESCE_LANES"},
			lines: []string{"IDEMPOTENCY_REDIS_COALESCE_LANES: must be 0 (off) or more, got -1"},
		},
		{
			name:  "REDIS_REPLICA_ACKS negative",
			env:   env("REDIS_REPLICA_ACKS", "-1"),
			want:  []string{"REDIS_REPLICA_ACKS"},
			lines: []string{"IDEMPOTENCY_REDIS_REPLICA_ACKS: must be 0 (off) or more, got -1"},
		},
		{
			name:  "REDIS_REPLICA_ACKS with auto-pipelining",
			env:   map[string]string{"IDEMPOTENCY_REDIS_REPLICA_ACKS": "1", "IDEMPOTENCY_REDIS_AUTO_PIPELINE": "true"},
			want:  []string{"REDIS_REPLICA_ACKS"},
			lines: []string{"IDEMPOTENCY_REDIS_REPLICA_ACKS: cannot be combined with IDEMPOTENCY_REDIS_AUTO_PIPELINE=true: the touch of an acknowledged write and its WAIT must share one connection, which the AutoPipeliner does not keep"},
		},
		{
			name:  "REDIS_REPLICA_ACK_FSYNC with record format 1",
			env:   map[string]string{"IDEMPOTENCY_REDIS_REPLICA_ACK_FSYNC": "true", "IDEMPOTENCY_RECORD_FORMAT": "1"},
			want:  []string{"REDIS_REPLICA_ACKS"},
			lines: []string{"IDEMPOTENCY_REDIS_REPLICA_ACKS: needs IDEMPOTENCY_RECORD_FORMAT=2, and it is 1: a format 1 completion cannot be sent again safely"},
		},
		{
			name:  "REDIS_REPLICA_ACK_OPERATIONS alone",
			env:   env("REDIS_REPLICA_ACK_OPERATIONS", "payment.charge"),
			want:  []string{"REDIS_REPLICA_ACK_OPERATIONS"},
			lines: []string{"IDEMPOTENCY_REDIS_REPLICA_ACK_OPERATIONS: acknowledges nothing without IDEMPOTENCY_REDIS_REPLICA_ACKS (or IDEMPOTENCY_REDIS_REPLICA_ACK_FSYNC)"},
		},
		{
			name:  "REDIS_REPLICA_ACK_OPERATIONS invalid operation",
			env:   map[string]string{"IDEMPOTENCY_REDIS_REPLICA_ACKS": "1", "IDEMPOTENCY_REDIS_REPLICA_ACK_OPERATIONS": "payment.charge, ledger post"},
			want:  []string{"REDIS_REPLICA_ACK_OPERATIONS"},
			lines: []string{`IDEMPOTENCY_REDIS_REPLICA_ACK_OPERATIONS: operation "ledger post" has byte 0x20 at offset 6; only [A-Za-z0-9._-] is allowed`},
		},
		{
			name:  "OPERATION_TTLS empty operation",
			env:   env("OPERATION_TTLS", ":1h"),
			want:  []string{"OPERATION_TTLS"},
			lines: []string{`IDEMPOTENCY_OPERATION_TTLS: operation "": operation is empty`},
		},
		{
			name: "OPERATION_TTLS operation too long",
			env:  env("OPERATION_TTLS", strings.Repeat("a", 101)+":1h"),
			want: []string{"OPERATION_TTLS"},
		},
		{
			name:  "OPERATION_TTLS TTL out of bounds",
			env:   env("OPERATION_TTLS", "payment.charge:500ms"),
			want:  []string{"OPERATION_TTLS"},
			lines: []string{`IDEMPOTENCY_OPERATION_TTLS: operation "payment.charge": TTL 500ms is not within IDEMPOTENCY_MIN_TTL and IDEMPOTENCY_MAX_TTL [1s, 720h0m0s]`},
		},
		{
			name: "OPERATION_TTLS invalid operation with a TTL out of bounds",
			env:  env("OPERATION_TTLS", "payment charge:500ms,order.create:1h"),
			want: []string{"OPERATION_TTLS", "OPERATION_TTLS"},
			lines: []string{
				`IDEMPOTENCY_OPERATION_TTLS: operation "payment charge" has byte 0x20 at offset 7; only [A-Za-z0-9._-] is allowed`,
				`IDEMPOTENCY_OPERATION_TTLS: operation "payment charge": TTL 500ms is not within IDEMPOTENCY_MIN_TTL and IDEMPOTENCY_MAX_TTL [1s, 720h0m0s]`,
			},
		},
		{name: "MAX_RESULT_BYTES zero", env: env("MAX_RESULT_BYTES", "0"), want: []string{"MAX_RESULT_BYTES"}},
		{
			name:  "METRICS_NAMESPACE invalid",
			env:   env("METRICS_NAMESPACE", "my-app"),
			want:  []string{"METRICS_NAMESPACE"},
			lines: []string{`IDEMPOTENCY_METRICS_NAMESPACE: "my-app" is not a Prometheus name; use letters, digits and underscores, not starting with a digit`},
		},
		{
			// Checked whether or not metrics are on, so turning them on
			// cannot fail.
			name: "METRICS_NAMESPACE invalid with metrics off",
			env:  map[string]string{"IDEMPOTENCY_METRICS_NAMESPACE": "2fast", "IDEMPOTENCY_METRICS_ENABLED": "false"},
			want: []string{"METRICS_NAMESPACE"},
		},
		{
			name: "a coordinator and an observability option",
			env:  map[string]string{"IDEMPOTENCY_LEASE": "0s", "IDEMPOTENCY_METRICS_NAMESPACE": "shop:api"},
			want: []string{"LEASE", "METRICS_NAMESPACE"},
		},
		// The modes fail at parse in the environment; set in code, they
		// reach the packages' checks.
		{
			name:  "LOG_KEYS set in code",
			set:   func(s *idempotency.Settings) { s.LogKeys = "sha256" },
			want:  []string{"LOG_KEYS"},
			lines: []string{`IDEMPOTENCY_LOG_KEYS: unknown key logging mode "sha256": accepted values are hashed, plain, omitted`},
		},
		{
			name:  "IN_FLIGHT set in code",
			set:   func(s *idempotency.Settings) { s.InFlight = "queue" },
			want:  []string{"IN_FLIGHT"},
			lines: []string{`IDEMPOTENCY_IN_FLIGHT: unknown in-flight mode "queue": accepted values are wait, raise, run`},
		},
		{
			name:  "ON_STORAGE_ERROR set in code",
			set:   func(s *idempotency.Settings) { s.OnStorageError = "fail" },
			want:  []string{"ON_STORAGE_ERROR"},
			lines: []string{`IDEMPOTENCY_ON_STORAGE_ERROR: unknown on-storage-error mode "fail": accepted values are run, raise`},
		},
		{
			name: "OPERATION_TTLS set in code",
			set: func(s *idempotency.Settings) {
				s.OperationTTLS = idempotency.OperationTTLs{"": time.Hour, "order.create": time.Millisecond}
			},
			want: []string{"OPERATION_TTLS", "OPERATION_TTLS"},
		},
		{
			name: "the zero Settings",
			set:  func(s *idempotency.Settings) { *s = idempotency.Settings{} },
			want: []string{"REDIS_URL", "RECORD_FORMAT", "LEASE", "POLL_INTERVAL", "STORAGE_TIMEOUT", "MIN_TTL", "MAX_RESULT_BYTES"},
		},
	}
	exercised := map[string]bool{}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var s idempotency.Settings
			var err error
			if tt.env != nil {
				clearEnv(t)
				for k, v := range tt.env {
					t.Setenv(k, v)
				}
				var perr error
				if s, perr = idempotency.LoadEnv(); perr != nil {
					t.Fatalf("the values do not even parse: %v", perr)
				}
				got, lerr := idempotency.LoadSettings()
				if lerr == nil {
					t.Fatalf("LoadSettings() = %+v, nil; want an error", got)
				}
				if verr := s.Validate(); verr == nil || verr.Error() != lerr.Error() {
					t.Fatalf("LoadSettings() error = %q\nValidate() of the same values = %v", lerr, verr)
				}
				err = lerr
			} else {
				s = idempotency.DefaultSettings()
				tt.set(&s)
				if err = s.Validate(); err == nil {
					t.Fatalf("Validate() = nil for %+v; want an error", s)
				}
			}

			lines := errorLines(t, err)
			var named []string
			for _, line := range lines {
				m := variableLine.FindStringSubmatch(line)
				if m == nil {
					t.Errorf("line %q does not start with IDEMPOTENCY_<NAME>: ", line)
					continue
				}
				named = append(named, strings.TrimPrefix(m[1], idempotency.EnvPrefix+"_"))
				if strings.Contains(line, "(option ") {
					t.Errorf("line %q names an option that has no variable", line)
				}
				if opt := optionName.FindString(line); opt != "" {
					t.Errorf("line %q names the option %s instead of its variable", line, opt)
				}
			}
			if got, want := slices.Sorted(slices.Values(named)), slices.Sorted(slices.Values(tt.want)); !slices.Equal(got, want) {
				t.Errorf("the error names %v, want %v:\n%v", got, want, err)
			}
			for _, want := range tt.lines {
				if !slices.Contains(lines, want) {
					t.Errorf("error = %q\nwant the line %q", err, want)
				}
			}

			// The variables named are those of the refused options: the
			// case makes exactly those options invalid.
			for _, opt := range refusedOptions(s) {
				exercised[opt] = true
				v, ok := idempotency.OptionVariables[opt]
				if !ok {
					t.Errorf("refused option %s has no variable", opt)
				} else if !slices.Contains(tt.want, v) {
					t.Errorf("refused option %s (IDEMPOTENCY_%s) is not named in %v", opt, v, tt.want)
				}
			}

			// A coordinator built from these settings fails the same way,
			// not later with the options' own names.
			_, cerr := idempotency.NewCoordinator(s, memstore.New(), nil)
			if cerr == nil || cerr.Error() != err.Error() {
				t.Errorf("NewCoordinator() error = %v\nwant %q", cerr, err)
			}
		})
	}
	for opt := range idempotency.OptionVariables {
		if !exercised[opt] && !slices.Contains(cannotFail, opt) {
			t.Errorf("no case makes %s (IDEMPOTENCY_%s) invalid; add one", opt, idempotency.OptionVariables[opt])
		}
	}
}

// declaredOptions returns the exported With* functions that return Option
// in the Go files of dir, and every With* name in their string literals
// (option names in OptionErrors and messages).
func declaredOptions(t *testing.T, dir string) (options, named map[string]bool) {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil {
		t.Fatal(err)
	}
	options, named = map[string]bool{}, map[string]bool{}
	fset := token.NewFileSet()
	for _, file := range files {
		if strings.HasSuffix(file, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, file, nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range f.Decls {
			fd, ok := d.(*ast.FuncDecl)
			if !ok || fd.Recv != nil || !strings.HasPrefix(fd.Name.Name, "With") || !fd.Name.IsExported() {
				continue
			}
			if r := fd.Type.Results; r != nil && len(r.List) == 1 {
				if id, ok := r.List[0].Type.(*ast.Ident); ok && id.Name == "Option" {
					options[fd.Name.Name] = true
				}
			}
		}
		ast.Inspect(f, func(n ast.Node) bool {
			if lit, ok := n.(*ast.BasicLit); ok && lit.Kind == token.STRING {
				if s, err := strconv.Unquote(lit.Value); err == nil {
					for _, name := range optionName.FindAllString(s, -1) {
						named[name] = true
					}
				}
			}
			return true
		})
	}
	if len(options) < 3 {
		t.Fatalf("%s: found only the options %v; is the parser looking in the right place?", dir, options)
	}
	return options, named
}

// settingsOptions returns the options of package pkg that the named
// functions of settings.go call.
func settingsOptions(t *testing.T, pkg string, funcs ...string) map[string]bool {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), "settings.go", nil, parser.SkipObjectResolution)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	found := 0
	for _, d := range f.Decls {
		fd, ok := d.(*ast.FuncDecl)
		if !ok || !slices.Contains(funcs, fd.Name.Name) {
			continue
		}
		found++
		ast.Inspect(fd, func(n ast.Node) bool {
			if sel, ok := n.(*ast.SelectorExpr); ok {
				if id, ok := sel.X.(*ast.Ident); ok && id.Name == pkg && strings.HasPrefix(sel.Sel.Name, "With") {
					out[sel.Sel.Name] = true
				}
			}
			return true
		})
	}
	if found != len(funcs) {
		t.Fatalf("settings.go: found %d of the functions %v", found, funcs)
	}
	return out
}

// TestEveryOptionIsMappedOrDeliberatelyUnset is the drift guard: a new
// option of coordinator or observability must either get a variable (a
// Settings field with an option tag naming it, set by CoordinatorOptions or
// observerOptions) or be added to unsetOptions on purpose. Otherwise its
// errors would reach the user as "(option WithX)".
func TestEveryOptionIsMappedOrDeliberatelyUnset(t *testing.T) {
	coordOpts, coordNamed := declaredOptions(t, "coordinator")
	obsOpts, obsNamed := declaredOptions(t, "observability")

	// optionVariables is keyed by the bare name, which must therefore
	// belong to one package only.
	for opt := range coordOpts {
		if obsOpts[opt] {
			t.Errorf("%s is an option of both coordinator and observability; optionVariables cannot tell them apart", opt)
		}
	}
	declared := maps.Clone(coordOpts)
	maps.Copy(declared, obsOpts)

	for _, opt := range slices.Sorted(maps.Keys(declared)) {
		_, mapped := idempotency.OptionVariables[opt]
		unset := slices.Contains(unsetOptions, opt)
		switch {
		case mapped && unset:
			t.Errorf("%s is both mapped to IDEMPOTENCY_%s and listed as not set by Settings", opt, idempotency.OptionVariables[opt])
		case !mapped && !unset:
			t.Errorf("%s has no variable (no Settings field's option tag names it) and is not in unsetOptions: give it a Settings field or list it", opt)
		}
	}
	for opt := range idempotency.OptionVariables {
		if !declared[opt] {
			t.Errorf("optionVariables maps %s, which neither package declares (renamed?)", opt)
		}
	}
	for _, opt := range unsetOptions {
		if !declared[opt] {
			t.Errorf("unsetOptions lists %s, which neither package declares (renamed?)", opt)
		}
	}

	// What Settings sets is what is mapped, and nothing deliberately unset.
	set := settingsOptions(t, "coordinator", "CoordinatorOptions")
	maps.Copy(set, settingsOptions(t, "observability", "observerOptions"))
	if got, want := slices.Sorted(maps.Keys(set)), slices.Sorted(maps.Keys(idempotency.OptionVariables)); !slices.Equal(got, want) {
		t.Errorf("Settings sets the options %v;\noptionVariables maps %v", got, want)
	}

	// Every option name in the packages' messages is a declared option, so
	// that the rewriting of names in messages cannot miss a misspelt one.
	for name := range coordNamed {
		if !coordOpts[name] {
			t.Errorf("coordinator: a string names %s, which is not one of its options", name)
		}
	}
	for name := range obsNamed {
		if !obsOpts[name] {
			t.Errorf("observability: a string names %s, which is not one of its options", name)
		}
	}

	// Each mapped variable is one that LoadSettings reads.
	vars := idempotency.Variables()
	for opt, v := range idempotency.OptionVariables {
		if !slices.Contains(vars, idempotency.EnvPrefix+"_"+v) {
			t.Errorf("optionVariables maps %s to IDEMPOTENCY_%s, which is not a variable of Settings", opt, v)
		}
	}
}

// TestEveryFieldHasAnAcceptedVariable: one variable per Settings field, all
// of them read by LoadSettings (none refused as unknown) and all in
// docs/configuration.md, which the unknown-variable error points to.
func TestEveryFieldHasAnAcceptedVariable(t *testing.T) {
	vars := idempotency.Variables()
	typ := reflect.TypeFor[idempotency.Settings]()
	if len(vars) != typ.NumField() {
		t.Fatalf("%d variables for %d Settings fields: %v", len(vars), typ.NumField(), vars)
	}
	if dup := len(vars) - len(slices.Compact(slices.Sorted(slices.Values(vars)))); dup != 0 {
		t.Errorf("%d variables appear twice: %v", dup, vars)
	}

	// Set every variable, in field order, to its field's default: all are
	// accepted, and each reaches its own field.
	clearEnv(t)
	for i, v := range vars {
		if !strings.HasPrefix(v, idempotency.EnvPrefix+"_") {
			t.Errorf("variable %s lacks the prefix", v)
		}
		def, ok := typ.Field(i).Tag.Lookup("default")
		if !ok {
			t.Errorf("field %s has no default", typ.Field(i).Name)
		}
		t.Setenv(v, def)
	}
	got, err := idempotency.LoadSettings()
	if err != nil {
		t.Fatalf("LoadSettings() with every variable set to its default: %v", err)
	}
	if want := idempotency.DefaultSettings(); !reflect.DeepEqual(got, want) {
		t.Errorf("LoadSettings() =\n%+v\nwant\n%+v", got, want)
	}

	doc, err := os.ReadFile("docs/configuration.md")
	if err != nil {
		t.Fatal(err)
	}
	documented := map[string]bool{}
	core, _, _ := strings.Cut(string(doc), "\n## The PostgreSQL store's variables\n") // idempg's, checked by idempg
	for _, m := range regexp.MustCompile("(?m)^\\| `(IDEMPOTENCY_[A-Z_]+)` \\|").FindAllStringSubmatch(core, -1) {
		documented[m[1]] = true
	}
	if got, want := slices.Sorted(maps.Keys(documented)), slices.Sorted(slices.Values(vars)); !slices.Equal(got, want) {
		t.Errorf("docs/configuration.md documents %v;\nLoadSettings reads %v", got, want)
	}
}

// The error of a rounded lease used to come from coordinator.New, naming
// WithRenewInterval; it now comes from LoadSettings and Validate.
func TestRoundedLeaseFailsAtLoadSettings(t *testing.T) {
	clearEnv(t)
	t.Setenv("IDEMPOTENCY_LEASE", "1.5ms")
	t.Setenv("IDEMPOTENCY_RENEW_INTERVAL", "1.2ms")
	const want = "IDEMPOTENCY_RENEW_INTERVAL: must be shorter than IDEMPOTENCY_LEASE (1ms, rounded down from 1.5ms), got 1.2ms"
	if _, err := idempotency.LoadSettings(); err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("LoadSettings() error = %v\nwant one containing %q", err, want)
	}

	s := idempotency.DefaultSettings()
	s.Lease, s.RenewInterval = 1500*time.Microsecond, 1200*time.Microsecond
	_, err := idempotency.NewCoordinator(s, memstore.New(), nil)
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("NewCoordinator() error = %v\nwant one containing %q", err, want)
	}
	// coordinator.New itself still reports the option, for users without
	// Settings.
	_, err = coordinator.New(memstore.New(), s.CoordinatorOptions()...)
	var oe *coordinator.OptionError
	if !errors.As(err, &oe) || oe.Option != "WithRenewInterval" {
		t.Fatalf("coordinator.New() error = %v; want an *OptionError for WithRenewInterval", err)
	}
}
