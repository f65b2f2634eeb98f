package idemecho_test

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/labstack/echo/v4"
	"github.com/labstack/echo/v4/middleware"

	"github.com/idemkit/idempotency/coordinator"
	"github.com/idemkit/idempotency/idemecho"
	"github.com/idemkit/idempotency/idemhttp"
)

// The handler sees Echo's context (c.Get, c.Param, c.Path), the key scope
// reads it, an error the handler returns is the stored response, and outer
// middleware sees the status of every answer, live, replayed or refused.
func TestEchoContextAndScope(t *testing.T) {
	c, err := coordinator.New(redisStore(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })

	var runs atomic.Int64
	var statuses []int
	var errs []string
	e := echo.New()
	e.Use(middleware.Recover(), func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			c.Set("tenant", c.Request().Header.Get("X-Tenant"))
			err := next(c)
			if err != nil {
				errs = append(errs, err.Error())
				c.Error(err) // as Echo's logger does: the response is committed, so it writes nothing
			}
			statuses = append(statuses, c.Response().Status)
			return nil
		}
	})
	tenant := idemecho.WithKeyScope(func(c echo.Context) (string, error) {
		if t, _ := c.Get("tenant").(string); t != "" {
			return "tenant:" + t, nil
		}
		return "", errors.New("no tenant")
	})
	e.POST("/orders/:id", func(c echo.Context) error {
		n := runs.Add(1)
		if c.Param("id") == "0" {
			return echo.NewHTTPError(http.StatusNotFound, "no order 0")
		}
		return c.JSON(http.StatusCreated, map[string]any{"order": c.Param("id"), "tenant": c.Get("tenant"), "route": c.Path(), "run": n})
	}, idemecho.Middleware(c, tenant))
	send := func(id, tenant, key string) *httptest.ResponseRecorder {
		r := httptest.NewRequest(http.MethodPost, "/orders/"+id, strings.NewReader(`{}`))
		r.Header.Set(idemhttp.KeyHeader, key)
		if tenant != "" {
			r.Header.Set("X-Tenant", tenant)
		}
		w := httptest.NewRecorder()
		e.ServeHTTP(w, r)
		return w
	}

	first := send("42", "acme", "k")
	if first.Code != http.StatusCreated || first.Body.String() != `{"order":"42","route":"/orders/:id","run":1,"tenant":"acme"}`+"\n" {
		t.Fatalf("first = %d %q", first.Code, first.Body)
	}
	if again := send("42", "acme", "k"); again.Body.String() != first.Body.String() || again.Header().Get(idemhttp.ReplayedHeader) != "true" {
		t.Fatalf("retry = %d %s, want the replay of the first", again.Code, again.Body)
	}
	if other := send("42", "globex", "k"); other.Code != http.StatusCreated || !strings.Contains(other.Body.String(), `"run":2`) {
		t.Fatalf("another tenant's key = %d %s, want its own run", other.Code, other.Body)
	}
	if anon := send("42", "", "k"); anon.Code != http.StatusUnauthorized {
		t.Fatalf("no tenant = %d %s, want 401", anon.Code, anon.Body)
	}
	// An *echo.HTTPError is the response that is stored: a 404 with Echo's
	// body, replayed without running the handler again.
	missing := send("0", "acme", "k0")
	if missing.Code != http.StatusNotFound || missing.Body.String() != `{"message":"no order 0"}`+"\n" {
		t.Fatalf("order 0 = %d %q, want Echo's 404", missing.Code, missing.Body)
	}
	if again := send("0", "acme", "k0"); again.Code != http.StatusNotFound || again.Body.String() != missing.Body.String() ||
		again.Header().Get(idemhttp.ReplayedHeader) != "true" || runs.Load() != 3 {
		t.Fatalf("retry of order 0 = %d %q after %d runs, want the replayed 404 after 3", again.Code, again.Body, runs.Load())
	}
	if want := []int{201, 201, 201, 401, 404, 404}; !slices.Equal(statuses, want) {
		t.Fatalf("outer middleware saw statuses %v, want %v", statuses, want)
	}
	// The live 404's error reaches outer middleware once; its replay is not
	// an error.
	if want := []string{"code=404, message=no order 0"}; !slices.Equal(errs, want) {
		t.Fatalf("outer middleware saw errors %q, want %q", errs, want)
	}
}
