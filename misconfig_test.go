package idempotency_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
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
	"github.com/idemkit/idempotency/internal/redistest"
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

// A Redis that starts refusing the credentials at run time is logged as
// such, not as an outage.
func TestModuleLogsRefusedCredentialsAtRunTime(t *testing.T) {
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
	if _, err := coordinator.Do(t.Context(), c, coordinator.Call{Operation: "op", Key: "refused"}, charge(&runs)); err != nil {
		t.Fatal(err)
	}
	// Stopping waits for the background save of the unprotected run, which
	// is refused too: each refused call is one line, and every line of a
	// failed store call says what it was.
	app.RequireStop()
	refused := logs.FilterMessage("storage call failed: redis refused the credentials").Len()
	failed := logs.FilterMessageSnippet("storage call failed").Len()
	if refused == 0 || refused != failed {
		t.Fatalf("%d lines say the credentials were refused, of %d failed store calls; want every one; logged %v", refused, failed, logs.All())
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
