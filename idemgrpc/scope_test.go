package idemgrpc_test

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	"github.com/idemkit/idempotency/coordinator/idemstore"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idempotency/coordinator"
	"github.com/idemkit/idempotency/coordinator/memstore"
	"github.com/idemkit/idempotency/idemgrpc"
	"github.com/idemkit/idempotency/idemhttp"
	"github.com/idemkit/idempotency/idemkey"
	"github.com/idemkit/idempotency/internal/redistest"
	"github.com/idemkit/idempotency/redisrepo"
)

// TestHTTPAndGRPCScopeKeysAlike stores the same scope and client key through
// the HTTP middleware and the gRPC interceptor, each under its own key
// prefix on one real Redis, and finds both records under the same Redis key
// after the prefix: idemkey.Scoped's, the key `idemctl lookup -scope` reads.
// The client keys cover both forms of a scoped key, ":" and, past 255
// bytes, "#" and a hash.
func TestHTTPAndGRPCScopeKeysAlike(t *testing.T) {
	const op, scope = "payments.charge", "shop_1"
	keys := []string{"order-42", strings.Repeat("k", coordinator.MaxKeyLen)}
	prefix := redistest.Prefix(t)
	rc := redis.NewClient(redistest.ServerOptions(t))
	t.Cleanup(func() { _ = rc.Close() })
	newC := func(p string) *coordinator.Coordinator {
		c, _ := newCoordinator(t, redisrepo.New(rc, redisrepo.WithKeyPrefix(p)))
		return c
	}

	httpPrefix := prefix + "http:"
	mw := idemhttp.Middleware(newC(httpPrefix), idemhttp.WithOperation(op),
		idemhttp.WithKeyScope(func(*http.Request) (string, error) { return scope, nil }))
	h := mw(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusCreated) }))
	for _, k := range keys {
		r := httptest.NewRequest(http.MethodPost, "/payments", strings.NewReader(`{}`))
		r.Header.Set(idemhttp.KeyHeader, k)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		if w.Code != http.StatusCreated {
			t.Fatalf("HTTP status %d, want 201", w.Code)
		}
	}

	grpcPrefix := prefix + "grpc:"
	client := serve(t, newC(grpcPrefix), &payments{}, []idemgrpc.Option{
		idemgrpc.WithOperation(func(string) string { return op }),
		idemgrpc.WithKeyScope(func(context.Context) (string, error) { return scope, nil }),
	})
	for _, k := range keys {
		if r := charge(withKey(t, k), client, chargeReq(1)); r.err != nil {
			t.Fatalf("gRPC Charge: %v", r.err)
		}
	}

	var want []string
	for _, k := range keys {
		want = append(want, op+":"+idemkey.Scoped(scope, k))
	}
	slices.Sort(want)
	for _, p := range []string{httpPrefix, grpcPrefix} {
		stored, err := rc.Keys(t.Context(), p+"*").Result()
		if err != nil {
			t.Fatal(err)
		}
		for i := range stored {
			stored[i] = strings.TrimPrefix(stored[i], p)
		}
		slices.Sort(stored)
		if !slices.Equal(stored, want) {
			t.Errorf("keys under %q: %q, want %q", p, stored, want)
		}
	}
}

// The fingerprint's encoding is pinned: a change would make every retry
// across an upgrade a key reuse.
func TestFingerprintEncoding(t *testing.T) {
	store := memstore.New()
	c, _ := newCoordinator(t, store)
	client := serve(t, c, &payments{}, nil)
	if r := charge(withKey(t, "k"), client, chargeReq(1)); r.err != nil {
		t.Fatal(r.err)
	}
	rec, err := store.Get(t.Context(), idemstore.Key{Operation: "payments.v1.Payments.Charge", Key: "k"})
	if err != nil {
		t.Fatal(err)
	}
	var enc []byte
	field := func(b []byte) { enc = binary.BigEndian.AppendUint64(enc, uint64(len(b))); enc = append(enc, b...) }
	field([]byte("idemgrpc/1"))
	field([]byte(chargeMethod))
	field(deterministic(t, chargeReq(1)))
	if want := sha256.Sum256(enc); rec.Fingerprint != hex.EncodeToString(want[:]) {
		t.Errorf("fingerprint %s, want %x", rec.Fingerprint, want)
	}
}
