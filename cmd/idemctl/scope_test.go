package main

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/idemkit/idempotency/coordinator"
	"github.com/idemkit/idempotency/idemhttp"
	"github.com/idemkit/idempotency/idemkey"
	"github.com/idemkit/idempotency/redisrepo"
)

// lookup -scope and forget -scope find the record the HTTP middleware
// stored for a scoped caller, which lookup without -scope reports absent.
func TestScope(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		c, err := coordinator.New(redisrepo.New(b.client, redisrepo.WithKeyPrefix(b.prefix)))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close() })
		var runs atomic.Int64
		mux := http.NewServeMux()
		mux.Handle("POST /payments", idemhttp.Middleware(c, idemhttp.WithKeyScope(func(r *http.Request) (string, error) {
			return r.Header.Get("X-Tenant"), nil
		}))(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			w.WriteHeader(http.StatusCreated)
			fmt.Fprintf(w, `{"id":"pay_%d"}`, runs.Add(1))
		})))
		pay := func() {
			t.Helper()
			r := httptest.NewRequest(http.MethodPost, "/payments", strings.NewReader(`{}`))
			r.Header.Set(idemhttp.KeyHeader, "order-42")
			r.Header.Set("X-Tenant", "shop_1")
			w := httptest.NewRecorder()
			mux.ServeHTTP(w, r)
			if w.Code != http.StatusCreated {
				t.Fatalf("POST /payments: %d %s", w.Code, w.Body)
			}
		}
		pay()

		stored := idemkey.Scoped("shop_1", "order-42")
		r := idemctl(t, b.env, "", false, "lookup", "-scope", "shop_1", "-result", "POST.payments", "order-42")
		for _, want := range []string{
			"POST.payments order-42 (scope \"shop_1\")\n  stored key   " + stored + "\n  redis key    " + b.prefix + "POST.payments:" + stored + "\n  state        completed\n",
			`{\"id\":\"pay_1\"}"`,
		} {
			if r.code != exitOK || !strings.Contains(r.stdout, want) {
				t.Errorf("lookup -scope: exit %d, output lacks %q:\n%s", r.code, want, r.output())
			}
		}
		if r := idemctl(t, b.env, "", false, "lookup", "POST.payments", "order-42"); !strings.Contains(r.stdout, "state        absent") {
			t.Errorf("lookup without -scope finds the scoped record:\n%s", r.output())
		}
		if r := idemctl(t, b.env, "", false, "lookup", "-scope", "", "POST.payments", "order-42"); !strings.Contains(r.stdout, "state        absent") {
			t.Errorf("lookup -scope '' (a scope of its own) finds shop_1's record:\n%s", r.output())
		}

		r = idemctl(t, b.env, "", false, "lookup", "-json", "POST.payments", "order-42", "-scope", "shop_1")
		var got []lookupEntry
		if err := json.Unmarshal([]byte(r.stdout), &got); err != nil || len(got) != 1 {
			t.Fatalf("lookup -json -scope: %v\n%s", err, r.output())
		}
		if e := got[0]; e.Key != "order-42" || e.Scope == nil || *e.Scope != "shop_1" || e.StoredKey != stored ||
			e.RedisKey != b.prefix+"POST.payments:"+stored || e.State != "completed" {
			t.Errorf("lookup -json -scope: %+v", e)
		}

		r = idemctl(t, b.env, "", false, "forget", "-scope", "shop_1", "POST.payments", "order-42")
		if r.code != exitOK || !strings.Contains(r.stdout, `forgot 1 of 1 key of POST.payments in scope "shop_1" (0 absent)`) {
			t.Fatalf("forget -scope: exit %d\n%s", r.code, r.output())
		}
		pay() // forgotten: the handler runs again
		if n := runs.Load(); n != 2 {
			t.Errorf("the handler ran %d times, want 2 (once more after forget -scope)", n)
		}

		r = idemctl(t, b.env, "", false, "forget", "-scope", "shop_1", "-operation", "POST.payments", "-all", "-yes")
		if r.code != exitUsage || !strings.Contains(r.stderr, "-scope goes with keys") {
			t.Errorf("forget -scope -all: exit %d, want %d:\n%s", r.code, exitUsage, r.output())
		}
	})
}
