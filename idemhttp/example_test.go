package idemhttp_test

import (
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/idemkit/idempotency/coordinator"
	"github.com/idemkit/idempotency/coordinator/memstore"
	"github.com/idemkit/idempotency/idemhttp"
)

func Example() {
	// In production the store is the Redis store; memstore keeps this
	// example self-contained.
	c, err := coordinator.New(memstore.New())
	if err != nil {
		panic(err)
	}
	idem := idemhttp.Middleware(c,
		// Scope keys to the caller, so nobody can replay another's response.
		idemhttp.WithKeyScope(func(r *http.Request) (string, error) {
			if user, _, ok := r.BasicAuth(); ok {
				return user, nil
			}
			return "", errors.New("anonymous")
		}),
	)

	charges := 0
	mux := http.NewServeMux()
	// Wrap the route's handler inside the mux, so the operation is named
	// after the pattern: "POST.payments".
	mux.Handle("POST /payments", idem(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		charges++
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Location", fmt.Sprintf("/payments/pay_%d", charges))
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"id":"pay_%d"}`+"\n", charges)
	})))

	post := func(key, body string) {
		r := httptest.NewRequest("POST", "/payments", strings.NewReader(body))
		r.SetBasicAuth("alice", "secret")
		r.Header.Set("Idempotency-Key", key)
		w := httptest.NewRecorder()
		mux.ServeHTTP(w, r)
		fmt.Printf("%d replayed=%q %s", w.Code, w.Header().Get("Idempotent-Replayed"), w.Body)
	}
	post(`"order-42"`, `{"amount":1999}`) // the first request runs the handler
	post(`"order-42"`, `{"amount":1999}`) // a retry gets the stored response
	post(`"order-42"`, `{"amount":5000}`) // the same key for another request
	fmt.Println("charges:", charges)
	// Output:
	// 201 replayed="" {"id":"pay_1"}
	// 201 replayed="true" {"id":"pay_1"}
	// 422 replayed="" {"type":"https://github.com/idemkit/idempotency/blob/main/docs/http.md#key-reuse","title":"Idempotency-Key reused","status":422,"detail":"This Idempotency-Key was used for a different request (method, path, query or body). Use a new key for a new request."}
	// charges: 1
}

func ExampleOperationName() {
	fmt.Println(idemhttp.OperationName("POST /payments/{id}/refunds"))
	// Output: POST.payments.id.refunds
}

func ExampleWithStorePolicy() {
	c, _ := coordinator.New(memstore.New())
	// Also replay 503s, e.g. for a handler whose 503 means "the provider
	// declined, do not retry this charge".
	_ = idemhttp.Middleware(c, idemhttp.WithStorePolicy(func(status int) bool {
		return status == http.StatusServiceUnavailable || idemhttp.DefaultStorePolicy(status)
	}))
	fmt.Println(idemhttp.DefaultStorePolicy(201), idemhttp.DefaultStorePolicy(429), idemhttp.DefaultStorePolicy(500))
	// Output: true false false
}
