package main

import (
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idempotency/internal/redistest"
)

// A Redis that answers but refuses idemctl, a TLS mismatch, and a server
// that is not Redis are misconfigurations: lookup, forget and count say
// what to change, naming the variable, in the words of the module's
// start-up check, and never call them an outage. Only a Redis that does not
// answer is "unreachable". Every one exits 1 (docs/cli.md, "Exit status"),
// shows no part of the password, and forgets nothing.
func TestRefusalIsAMisconfiguration(t *testing.T) {
	// No three bytes in a row of a password here are in Redis's replies
	// (WRONGPASS invalid username-password pair ...), or the reply would
	// not be shown, as the module would not show it.
	const secret = "Zq8Wm3vKp2Xr7Jd"
	p, err := redistest.StartProcess(t.TempDir())
	if err != nil {
		t.Skipf("cannot start a redis-server of this test's own: %v", err)
	}
	t.Cleanup(p.Kill)
	plain, err := redistest.StartProcess(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(plain.Kill)
	admin := redis.NewClient(&redis.Options{Addr: p.Addr()})
	t.Cleanup(func() { _ = admin.Close() })
	for _, cmd := range [][]any{
		{"CONFIG", "SET", "requirepass", secret},
		{"AUTH", secret},
		// A user who may not even PING.
		{"ACL", "SETUSER", "noping", "on", ">" + secret + "-noping", "~*", "+hello", "+client"},
		{"SET", "idempotency:op:kept", "x"},
	} {
		if err := admin.Do(t.Context(), cmd...).Err(); err != nil {
			t.Fatalf("%v: %v", cmd[:2], err)
		}
	}
	// An HTTPS server: TLS, with a certificate no system trusts.
	tlsServer := httptest.NewUnstartedServer(http.NotFoundHandler())
	tlsServer.Config.ErrorLog = log.New(io.Discard, "", 0) // the handshakes that fail
	tlsServer.StartTLS()
	t.Cleanup(tlsServer.Close)
	tlsAddr := strings.TrimPrefix(tlsServer.URL, "https://")
	web := httptest.NewServer(http.NotFoundHandler())
	t.Cleanup(web.Close)
	webAddr := strings.TrimPrefix(web.URL, "http://")

	const urlVar = "IDEMPOTENCY_REDIS_URL: "
	for _, tc := range []struct {
		name, url string
		want      string // the error, after "idemctl <command>: "
	}{
		{"wrong password", "redis://:Q" + secret + "@" + p.Addr() + "/0",
			urlVar + "redis at " + p.Addr() + " refused the credentials (check the user name and password): WRONGPASS "},
		{"missing password", "redis://" + p.Addr() + "/0",
			urlVar + "redis at " + p.Addr() + " refused the credentials (check the user name and password): NOAUTH "},
		{"wrong user", "redis://nobody:" + secret + "@" + p.Addr() + "/0", urlVar + "redis at " + p.Addr() + " refused the credentials"},
		{"no permission", "redis://noping:" + secret + "-noping@" + p.Addr() + "/0",
			urlVar + "redis at " + p.Addr() + " denied the user a permission the store needs"},
		{"unknown database", "redis://:" + secret + "@" + p.Addr() + "/99",
			urlVar + "redis at " + p.Addr() + " has no database 99 (its databases setting is lower): ERR DB index is out of range"},
		{"rediss against a plain server", "rediss://" + plain.Addr() + "/0",
			urlVar + "the server at " + plain.Addr() + " does not speak TLS: use redis://"},
		{"redis against a TLS server", "redis://:" + secret + "@" + tlsAddr + "/0",
			urlVar + "the server at " + tlsAddr + " speaks TLS only: use rediss://"},
		{"untrusted certificate", "rediss://:" + secret + "@" + tlsAddr + "/0",
			urlVar + "the TLS handshake with " + tlsAddr + " failed: tls: failed to verify certificate"},
		{"not redis", "redis://:" + secret + "@" + webAddr + "/0",
			urlVar + "the server at " + webAddr + " does not speak the Redis protocol (is this the Redis port?)"},
		{"unreachable", "redis://:" + secret + "@127.0.0.1:1/0",
			"redis at 127.0.0.1:1 is unreachable: dial tcp 127.0.0.1:1: connect: connection refused"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// A storage timeout long enough for a TLS handshake on a busy
			// machine (a -race build beside other tests: 300ms was not),
			// but for the plain server, which never answers a handshake:
			// its answer is the timeout.
			timeout := "3s"
			if tc.name == "rediss against a plain server" {
				timeout = "300ms"
			}
			env := map[string]string{"IDEMPOTENCY_REDIS_URL": tc.url, "IDEMPOTENCY_STORAGE_TIMEOUT": timeout}
			for _, cmd := range [][]string{{"lookup", "op", "k"}, {"forget", "op", "kept"}, {"count"}} {
				r := idemctl(t, env, "", false, cmd...)
				if want := "idemctl " + cmd[0] + ": " + tc.want; r.code != exitFailure || !strings.HasPrefix(r.stderr, want) {
					t.Errorf("%v: exit %d, want %d and %q:\n%s", cmd, r.code, exitFailure, want, r.output())
				}
				if tc.name != "unreachable" && strings.Contains(r.output(), "unreachable") {
					t.Errorf("%v calls a misconfiguration an outage:\n%s", cmd, r.output())
				}
				for _, part := range []string{secret, secret[:6], secret[6:]} {
					if strings.Contains(r.output(), part) {
						t.Errorf("%v shows (part of) the password %q:\n%s", cmd, part, r.output())
					}
				}
			}
			// check says it in the same words, under the server.
			r := idemctl(t, env, "", false, "check")
			want := "  server: FAILED: " + tc.want
			if tc.name == "unreachable" {
				want = "  server: FAILED: ping: dial tcp 127.0.0.1:1: connect: connection refused"
			}
			if r.code != exitFailure || !strings.Contains(r.stdout, want) {
				t.Errorf("check: exit %d, want %d and %q:\n%s", r.code, exitFailure, want, r.output())
			}
		})
	}
	if n, err := admin.Exists(t.Context(), "idempotency:op:kept").Result(); err != nil || n != 1 {
		t.Errorf("a refused forget forgot a key: EXISTS = %d, %v", n, err)
	}
}
