package idemgin_test

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/gin-gonic/gin"

	"github.com/idemkit/idempotency/coordinator"
	"github.com/idemkit/idempotency/coordinator/memstore"
	"github.com/idemkit/idempotency/idemgin"
	"github.com/idemkit/idempotency/idemhttp"
	"github.com/idemkit/idempotency/internal/redistest"
	"github.com/idemkit/idempotency/redisrepo"
)

// orders is a gin app whose outer middleware puts the tenant in the
// context and notes the status of every response; /orders/:id is behind
// Middleware with the tenant as the key scope.
type orders struct {
	*gin.Engine
	runs     atomic.Int64
	mu       sync.Mutex
	statuses []int
}

func newOrders(c *coordinator.Coordinator) *orders {
	o := &orders{Engine: gin.New()}
	o.Use(gin.Recovery(), func(c *gin.Context) {
		c.Set("tenant", c.GetHeader("X-Tenant"))
		c.Next()
		o.mu.Lock()
		o.statuses = append(o.statuses, c.Writer.Status())
		o.mu.Unlock()
	})
	tenant := idemgin.WithKeyScope(func(c *gin.Context) (string, error) {
		if t := c.GetString("tenant"); t != "" {
			return "tenant:" + t, nil
		}
		return "", errors.New("no tenant")
	})
	o.POST("/orders/:id", idemgin.Middleware(c, tenant), func(c *gin.Context) {
		n := o.runs.Add(1)
		c.JSON(http.StatusCreated, gin.H{"order": c.Param("id"), "tenant": c.GetString("tenant"), "route": c.FullPath(), "run": n})
	})
	return o
}

func (o *orders) send(id, tenant, key string) *httptest.ResponseRecorder {
	r := httptest.NewRequest(http.MethodPost, "/orders/"+id, strings.NewReader(`{}`))
	r.Header.Set(idemhttp.KeyHeader, key)
	if tenant != "" {
		r.Header.Set("X-Tenant", tenant)
	}
	w := httptest.NewRecorder()
	o.ServeHTTP(w, r)
	return w
}

// The handler sees gin's context (c.Keys, c.Param, c.FullPath), the key
// scope reads it, and outer middleware sees the status of every answer,
// live, replayed or refused.
func TestGinContextAndScope(t *testing.T) {
	c, err := coordinator.New(redisStore(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	o := newOrders(c)

	first := o.send("42", "acme", "k")
	if first.Code != http.StatusCreated || first.Body.String() != `{"order":"42","route":"/orders/:id","run":1,"tenant":"acme"}` {
		t.Fatalf("first = %d %s", first.Code, first.Body)
	}
	if again := o.send("42", "acme", "k"); again.Body.String() != first.Body.String() || again.Header().Get(idemhttp.ReplayedHeader) != "true" {
		t.Fatalf("retry = %d %s, want the replay of the first", again.Code, again.Body)
	}
	if other := o.send("42", "globex", "k"); other.Code != http.StatusCreated || !strings.Contains(other.Body.String(), `"run":2`) {
		t.Fatalf("another tenant's key = %d %s, want its own run", other.Code, other.Body)
	}
	if anon := o.send("42", "", "k"); anon.Code != http.StatusUnauthorized {
		t.Fatalf("no tenant = %d %s, want 401", anon.Code, anon.Body)
	}
	if want := []int{201, 201, 201, 401}; !slices.Equal(o.statuses, want) {
		t.Fatalf("outer middleware saw statuses %v, want %v", o.statuses, want)
	}
}

// The records of "POST /orders/:id" are stored under the route's operation,
// where `idemctl lookup -scope` finds them.
func TestIdemctlFindsTheRoutesRecords(t *testing.T) {
	if testing.Short() {
		t.Skip("builds idemctl")
	}
	prefix := redistest.Prefix(t)
	c, err := coordinator.New(redisrepo.New(redistest.Server(t), redisrepo.WithKeyPrefix(prefix)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	o := newOrders(c)
	if w := o.send("42", "acme", "order-42"); w.Code != http.StatusCreated {
		t.Fatalf("order 42 = %d %s", w.Code, w.Body)
	}
	cmd := exec.Command("go", "run", ".",
		"-redis-url", "redis://"+redistest.ServerOptions(t).Addr+"/0", "-key-prefix", prefix,
		"lookup", "-scope", "tenant:acme", "-result", "POST.orders.id", "order-42")
	cmd.Dir = "../cmd/idemctl" // a module of its own, built against this checkout (its go.work)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("idemctl lookup: %v\n%s", err, out)
	}
	for _, want := range []string{`POST.orders.id order-42 (scope "tenant:acme")`, "state        completed", `\"order\":\"42\"`} {
		if !strings.Contains(string(out), want) {
			t.Fatalf("idemctl lookup printed\n%s\nwant %q in it", out, want)
		}
	}
}

// On the engine (Use), the middleware keeps the status gin gives a request
// that no route matched: a POST to a mistyped path is a 404, live and
// replayed, never a stored 200 that reads as success.
func TestEngineMiddlewareKeepsNoRoute(t *testing.T) {
	c, err := coordinator.New(memstore.New())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	r := gin.New()
	r.HandleMethodNotAllowed = true
	r.Use(idemgin.Middleware(c))
	r.POST("/orders", func(c *gin.Context) { c.JSON(http.StatusCreated, gin.H{"ok": true}) })
	for _, tc := range []struct {
		method, path string
		want         int
	}{
		{http.MethodPost, "/ordres", http.StatusNotFound},
		{http.MethodPut, "/orders", http.StatusMethodNotAllowed},
	} {
		for try := range 2 {
			req := httptest.NewRequest(tc.method, tc.path, strings.NewReader(`{}`))
			req.Header.Set(idemhttp.KeyHeader, "k-"+tc.method)
			w := httptest.NewRecorder()
			r.ServeHTTP(w, req)
			if w.Code != tc.want {
				t.Errorf("%s %s, try %d: %d %q, want %d", tc.method, tc.path, try+1, w.Code, w.Body, tc.want)
			}
		}
	}
}
