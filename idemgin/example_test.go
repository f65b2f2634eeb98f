package idemgin_test

import (
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/gin-gonic/gin"

	"github.com/idemkit/idempotency/coordinator"
	"github.com/idemkit/idempotency/coordinator/memstore"
	"github.com/idemkit/idempotency/idemgin"
)

func Example() {
	gin.SetMode(gin.ReleaseMode)
	// In production the store is the Redis store (or idempg); memstore
	// keeps this example self-contained.
	c, err := coordinator.New(memstore.New())
	if err != nil {
		panic(err)
	}
	r := gin.New()
	r.Use(func(c *gin.Context) { // authentication sets the tenant
		c.Set("tenant", c.GetHeader("X-Tenant"))
	})
	idem := idemgin.Middleware(c,
		// Scope keys to the tenant, so that no tenant replays another's
		// response.
		idemgin.WithKeyScope(func(c *gin.Context) (string, error) {
			if t := c.GetString("tenant"); t != "" {
				return "tenant:" + t, nil
			}
			return "", errors.New("no tenant")
		}),
	)
	charges := 0
	// The operation is named after the route: "POST./orders".
	r.POST("/orders", idem, func(c *gin.Context) {
		charges++
		c.JSON(http.StatusCreated, gin.H{"id": fmt.Sprintf("ord_%d", charges)})
	})

	post := func(tenant string) {
		req := httptest.NewRequest("POST", "/orders", strings.NewReader(`{"sku":"tea"}`))
		req.Header.Set("X-Tenant", tenant)
		req.Header.Set("Idempotency-Key", `"order-42"`)
		w := httptest.NewRecorder()
		r.ServeHTTP(w, req)
		fmt.Printf("%s: %d replayed=%q %s\n", tenant, w.Code, w.Header().Get("Idempotent-Replayed"), w.Body)
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
