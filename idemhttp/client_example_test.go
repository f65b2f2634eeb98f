package idemhttp_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"

	"github.com/idemkit/idempotency/coordinator"
	"github.com/idemkit/idempotency/coordinator/memstore"
	"github.com/idemkit/idempotency/idemhttp"
)

func ExampleNewTransport() {
	// A server behind the middleware; memstore keeps the example
	// self-contained.
	c, err := coordinator.New(memstore.New())
	if err != nil {
		panic(err)
	}
	var charges atomic.Int64
	mux := http.NewServeMux()
	mux.Handle("POST /payments", idemhttp.Middleware(c)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"id":"pay_%d"}`+"\n", charges.Add(1))
	})))
	srv := httptest.NewServer(mux)
	defer srv.Close()

	tr, err := idemhttp.NewTransport(srv.Client().Transport)
	if err != nil {
		panic(err)
	}
	client := &http.Client{Transport: tr}
	req, err := http.NewRequest(http.MethodPost, srv.URL+"/payments", strings.NewReader(`{"amount":1999}`))
	if err != nil {
		panic(err)
	}
	// Send the request twice, as a retry after a lost response would: the
	// Transport wrote its key into req.Header the first time.
	for range 2 {
		resp, err := client.Do(req)
		if err != nil {
			panic(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		fmt.Printf("%d replayed=%v %s", resp.StatusCode, idemhttp.Replayed(resp), body)
		req.Body, _ = req.GetBody() // the same body again
	}
	fmt.Println("charges:", charges.Load())
	// Output:
	// 201 replayed=false {"id":"pay_1"}
	// 201 replayed=true {"id":"pay_1"}
	// charges: 1
}

func ExampleSetKey() {
	req, _ := http.NewRequest(http.MethodPost, "https://api.example.com/payments", strings.NewReader(`{"amount":1999}`))
	// Once per logical request, before the retry loop: every clone of req
	// made in the loop carries the key.
	if err := idemhttp.SetKey(req, "order-42"); err != nil {
		panic(err)
	}
	fmt.Println(req.Clone(req.Context()).Header.Get("Idempotency-Key"))
	fmt.Println(idemhttp.SetKey(req, "order 42"))
	// Output:
	// order-42
	// idemhttp: SetKey: idempotency: invalid request: key has byte 0x20 at offset 5; only visible ASCII (0x21-0x7e) is allowed
}
