package idemhttp_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/idemkit/idempotency/coordinator/idemstore"

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

func ExampleTransport_insideAnAction() {
	// The provider deduplicates by Idempotency-Key, as Stripe does.
	var charges atomic.Int64
	var mu sync.Mutex
	kept := map[string]string{}
	provider := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key := r.Header.Get(idemhttp.KeyHeader)
		mu.Lock()
		defer mu.Unlock()
		if _, ok := kept[key]; !ok {
			kept[key] = fmt.Sprintf(`{"id":"ch_%d"}`, charges.Add(1))
		}
		fmt.Fprintln(w, kept[key])
	}))
	defer provider.Close()
	tr, err := idemhttp.NewTransport(provider.Client().Transport)
	if err != nil {
		panic(err)
	}
	client := &http.Client{Transport: tr}

	// The service's own idempotency: memstore keeps the example
	// self-contained.
	store := memstore.New()
	c, err := coordinator.New(store)
	if err != nil {
		panic(err)
	}
	defer c.Close()
	call := coordinator.Call{Operation: "order.checkout", Key: "order-42"}
	checkout := func(ctx context.Context) (string, error) {
		// The request carries the action's context, so the Transport sends
		// the action's downstream key: the same on every run.
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, provider.URL+"/v1/charges", strings.NewReader(`{"amount":1999}`))
		if err != nil {
			return "", err
		}
		resp, err := client.Do(req)
		if err != nil {
			return "", err
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		return strings.TrimSpace(string(body)), err
	}
	first, _ := coordinator.Do(context.Background(), c, call, checkout)
	// A failover loses the record, and the client retries: the action runs
	// again, and the provider answers from its own record.
	store.Put(idemstore.Key{Operation: call.Operation, Key: call.Key}, idemstore.Record{})
	again, _ := coordinator.Do(context.Background(), c, call, checkout)
	fmt.Println(first, again, "charges:", charges.Load())
	// Output: {"id":"ch_1"} {"id":"ch_1"} charges: 1
}
