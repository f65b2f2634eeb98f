package idemecho_test

import (
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/labstack/echo/v4"

	"github.com/idemkit/idempotency/coordinator"
	"github.com/idemkit/idempotency/coordinator/memstore"
	"github.com/idemkit/idempotency/idemecho"
)

func Example() {
	// In production the store is the Redis store (or idempg); memstore
	// keeps this example self-contained.
	c, err := coordinator.New(memstore.New())
	if err != nil {
		panic(err)
	}
	e := echo.New()
	e.Use(func(next echo.HandlerFunc) echo.HandlerFunc { // authentication sets the tenant
		return func(c echo.Context) error {
			c.Set("tenant", c.Request().Header.Get("X-Tenant"))
			return next(c)
		}
	})
	idem := idemecho.Middleware(c,
		// Scope keys to the tenant, so that no tenant replays another's
		// response.
		idemecho.WithKeyScope(func(c echo.Context) (string, error) {
			if t, _ := c.Get("tenant").(string); t != "" {
				return "tenant:" + t, nil
			}
			return "", errors.New("no tenant")
		}),
	)
	charges := 0
	// The operation is named after the route: "POST./orders".
	e.POST("/orders", func(c echo.Context) error {
		charges++
		return c.JSON(http.StatusCreated, map[string]string{"id": fmt.Sprintf("ord_%d", charges)})
	}, idem)

	post := func(tenant string) {
		req := httptest.NewRequest("POST", "/orders", strings.NewReader(`{"sku":"tea"}`))
		req.Header.Set("X-Tenant", tenant)
		req.Header.Set("Idempotency-Key", `"order-42"`)
		w := httptest.NewRecorder()
		e.ServeHTTP(w, req)
		fmt.Printf("%s: %d replayed=%q %s", tenant, w.Code, w.Header().Get("Idempotent-Replayed"), w.Body)
	}
	post("acme")   // the first request runs the handler
	post("acme")   // a retry gets the stored response
	post("globex") // the same key from another tenant is another key
	fmt.Println("charges:", charges)
	// Output:
	// acme: 201 replayed="" {"id":"ord_1"}
	// acme: 201 replayed="true" {"id":"ord_1"}
	// globex: 201 replayed="" {"id":"ord_2"}
	// charges: 2
}
