// Command chargeworker is the two processes of the reliability suite's
// provider storm (reliability/provider_test.go): a payment provider that
// deduplicates charges by their Idempotency-Key and counts them, and a
// service that charges orders through coordinator.Do over Redis with the
// client idemhttp.Transport, which the driver kills -9 around the provider
// call.
//
//	chargeworker provider -delay 20ms
//
// serves POST /v1/charges ({"order": "o-1"}, an Idempotency-Key header
// required): the first request with a key waits -delay (the provider at
// work), charges the order and keeps its answer under the key; a request
// with a key whose charge is under way gets 409 with Retry-After, and one
// with a kept key gets the kept answer. GET /v1/counts returns the charges
// per order. It prints {"t":"ready","addr":...} once it listens.
//
//	chargeworker service -provider http://addr [-mint]
//
// is an fx app with idempotency.Module, configured by its IDEMPOTENCY_*
// environment, that charges each order read from standard input (one a
// line) as the operation "order.charge" keyed by the order, and prints a
// line as the action calls the provider ("calling"), once the provider
// answered ("called") and when Do returns ("done", with the charge or the
// error). With -mint every run of the action sends a fresh key
// (idemhttp.ContextWithKey with idemhttp.NewKey), as the Transport did
// before downstream keys: the storm's control.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"

	"go.uber.org/fx"
	"go.uber.org/zap"

	idempotency "github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/coordinator"
	"github.com/idemkit/idempotency/idemhttp"
)

// line is one line of output.
type line struct {
	T      string `json:"t"`
	Addr   string `json:"addr,omitempty"`
	Order  string `json:"order,omitempty"`
	Charge string `json:"charge,omitempty"`
	Err    string `json:"err,omitempty"`
	Pid    int    `json:"pid,omitempty"`
}

// out writes whole lines to standard output, one write each, so that lines
// of concurrent calls never interleave and a line written survives a kill.
type out struct{ mu sync.Mutex }

func (o *out) put(l line) {
	b, err := json.Marshal(l)
	if err != nil {
		panic(err)
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	_, _ = os.Stdout.Write(append(b, '\n'))
}

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: chargeworker provider|service [flags]")
		os.Exit(2)
	}
	switch os.Args[1] {
	case "provider":
		provider(os.Args[2:])
	case "service":
		service(os.Args[2:])
	default:
		fmt.Fprintf(os.Stderr, "chargeworker: unknown mode %q\n", os.Args[1])
		os.Exit(2)
	}
}

// charge is the provider's answer to a charge.
type charge struct {
	ID    string `json:"id"`
	Order string `json:"order"`
}

// ledger is the provider's state: the answers kept per key, the keys under
// way, and the charges per order.
type ledger struct {
	mu      sync.Mutex
	kept    map[string][]byte
	busy    map[string]bool
	charges map[string]int
	n       int
}

func provider(args []string) {
	fs := flag.NewFlagSet("provider", flag.ExitOnError)
	delay := fs.Duration("delay", 20*time.Millisecond, "how long a charge takes")
	_ = fs.Parse(args)
	l := &ledger{kept: map[string][]byte{}, busy: map[string]bool{}, charges: map[string]int{}}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/charges", func(w http.ResponseWriter, r *http.Request) {
		key := r.Header.Get(idemhttp.KeyHeader)
		var req struct{ Order string }
		if err := json.NewDecoder(io.LimitReader(r.Body, 1<<16)).Decode(&req); err != nil || key == "" || req.Order == "" {
			http.Error(w, "an Idempotency-Key and an order are required", http.StatusBadRequest)
			return
		}
		l.mu.Lock()
		if b, ok := l.kept[key]; ok {
			l.mu.Unlock()
			w.Header().Set("Idempotent-Replayed", "true")
			_, _ = w.Write(b)
			return
		}
		if l.busy[key] {
			l.mu.Unlock()
			w.Header().Set("Retry-After", "1")
			http.Error(w, "a request with this key is under way", http.StatusConflict)
			return
		}
		l.busy[key] = true
		l.mu.Unlock()
		// The charge is made whatever happens to the caller meanwhile.
		time.Sleep(*delay)
		l.mu.Lock()
		l.n++
		l.charges[req.Order]++
		b, _ := json.Marshal(charge{ID: fmt.Sprintf("ch_%d", l.n), Order: req.Order})
		l.kept[key] = b
		delete(l.busy, key)
		l.mu.Unlock()
		_, _ = w.Write(b)
	})
	mux.HandleFunc("GET /v1/counts", func(w http.ResponseWriter, _ *http.Request) {
		l.mu.Lock()
		defer l.mu.Unlock()
		_ = json.NewEncoder(w).Encode(l.charges)
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Fprintln(os.Stderr, "chargeworker provider:", err)
		os.Exit(2)
	}
	(&out{}).put(line{T: "ready", Addr: ln.Addr().String(), Pid: os.Getpid()})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	if err := srv.Serve(ln); err != nil {
		fmt.Fprintln(os.Stderr, "chargeworker provider:", err)
		os.Exit(1)
	}
}

// callDeadline bounds one order's Do: far beyond any wait of the storm, so
// that one that reaches it is a hang.
const callDeadline = 30 * time.Second

func service(args []string) {
	fs := flag.NewFlagSet("service", flag.ExitOnError)
	providerURL := fs.String("provider", "", "the provider's base URL")
	mint := fs.Bool("mint", false, "send a fresh key on every run of the action (the control)")
	_ = fs.Parse(args)
	o := &out{}
	var co *coordinator.Coordinator
	app := fx.New(fx.NopLogger, fx.Supply(zap.NewNop()), idempotency.Module, fx.Populate(&co))
	if err := app.Err(); err != nil {
		fmt.Fprintln(os.Stderr, "chargeworker service:", err)
		os.Exit(2)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	if err := app.Start(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "chargeworker service: start:", err)
		os.Exit(2)
	}
	cancel()
	tr, err := idemhttp.NewTransport(nil)
	if err != nil {
		fmt.Fprintln(os.Stderr, "chargeworker service:", err)
		os.Exit(2)
	}
	client := &http.Client{Transport: tr, Timeout: 10 * time.Second}
	o.put(line{T: "ready", Pid: os.Getpid()})

	var wg sync.WaitGroup
	sc := bufio.NewScanner(os.Stdin)
	for sc.Scan() {
		order := strings.TrimSpace(sc.Text())
		if order == "" {
			continue
		}
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), callDeadline)
			defer cancel()
			id, err := coordinator.Do(ctx, co, coordinator.Call{Operation: "order.charge", Key: order},
				func(ctx context.Context) (string, error) {
					if *mint {
						ctx = idemhttp.ContextWithKey(ctx, idemhttp.NewKey())
					}
					o.put(line{T: "calling", Order: order})
					id, err := chargeOrder(ctx, client, *providerURL, order)
					if err != nil {
						return "", err
					}
					o.put(line{T: "called", Order: order, Charge: id})
					return id, nil
				})
			l := line{T: "done", Order: order, Charge: id}
			if err != nil {
				l.Err = err.Error()
			}
			o.put(l)
		})
	}
	wg.Wait()
	ctx, cancel = context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_ = app.Stop(ctx)
}

// chargeOrder asks the provider to charge order and returns the charge's
// ID.
func chargeOrder(ctx context.Context, client *http.Client, base, order string) (string, error) {
	body, _ := json.Marshal(map[string]string{"order": order})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/charges", strings.NewReader(string(body)))
	if err != nil {
		return "", err
	}
	resp, err := client.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return "", fmt.Errorf("provider: %s: %s", resp.Status, strings.TrimSpace(string(b)))
	}
	var c charge
	if err := json.NewDecoder(resp.Body).Decode(&c); err != nil {
		return "", err
	}
	if c.ID == "" {
		return "", errors.New("provider: a charge without an ID")
	}
	return c.ID, nil
}
