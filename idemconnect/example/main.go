// Command example is a Connect payments service that shows idemconnect in
// an fx app on the PostgreSQL store: Charge runs behind the idempotency
// handler interceptor, inside the transaction in which its idempotency
// record commits, and writes the charge through that transaction
// (idempg.Tx). A client that retries a charge with the same Idempotency-Key
// header gets the first charge back instead of a second one, over any of
// Connect's three protocols (Connect, gRPC, gRPC-Web), and a crash at any
// instant leaves the charge and its record both, or neither. GetCharge
// reads a charge back from the charges table.
//
// Run it with
//
//	go run ./example           # from the idemconnect directory
//
// Without IDEMPOTENCY_POSTGRES_URL it starts a throwaway PostgreSQL server
// (Debian's postgresql package, initdb into a temporary directory, deleted
// on exit) and says so; set the variable to use your own database. It needs
// no Redis. The app applies the store's schema and creates its own table on
// start. The server listens on ADDR (default 127.0.0.1:8080), HTTP/1.1 and
// HTTP/2 without TLS (h2c), so that gRPC clients can call it; CHARGE_DELAY
// (default 50ms) is the payment provider's latency. Its client mode sends
// one charge, from another terminal:
//
//	go run ./example charge -key order-42 -tenant acme                  # charge ch_1: 1999 EUR on acct_1 for acme (replayed: false)
//	go run ./example charge -key order-42 -tenant acme -protocol grpc   # charge ch_1: 1999 EUR on acct_1 for acme (replayed: true)
//	go run ./example charge -key order-42 -tenant shop_2                # another tenant: a new charge
//
// The second answer is the first charge, with the response header
// "Idempotent-Replayed: true"; `charge -h` lists the flags. The client mode
// retries an attempt that timed out (-timeout) or that the server refused
// with Aborted or Unavailable, up to -attempts, with the same key: the key
// is made once, before the first attempt, and every attempt's context
// carries it (idemconnect.ContextWithKey). Against a server started with
// CHARGE_DELAY=3s:
//
//	$ go run ./example charge -key order-7 -timeout 1s
//	example charge: attempt 1: deadline_exceeded: context deadline exceeded; retrying in 100ms with the same key, order-7
//	example charge: attempt 2: aborted: a call with this idempotency key is still being processed; retry it later with the same key; retrying in 1s with the same key, order-7
//	charge ch_3: 1999 EUR on acct_1 for acme (replayed: true)
//
// The first attempt's charge was made (the provider charges whatever the
// client does, and the handler records it), and the last attempt got it
// back: one charge. The messages are google.protobuf.Struct values, whose
// JSON is a plain object, so curl works too (the Connect protocol with
// JSON):
//
//	curl -i -H 'Content-Type: application/json' -H 'X-Tenant: acme' -H 'Idempotency-Key: order-42' \
//	    -d '{"account":"acct_1","amount_cents":1999,"currency":"EUR"}' \
//	    http://127.0.0.1:8080/payments.v1.Payments/Charge
//
// The files: main.go (the fx wiring), server.go (the handlers and their
// interceptor), payments.go (the service and its charges table), client.go
// (the client mode). The configuration, the HTTP server (h2c) and the
// throwaway PostgreSQL are those the gin and Echo examples use too, from
// the package idempg/example/orders.
package main

import (
	"net/http"
	"os"

	"go.uber.org/fx"

	"github.com/idemkit/idempotency/idempg/example/orders"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "charge" {
		os.Exit(charge(os.Args[2:], os.Stdout, os.Stderr))
	}
	os.Exit(run())
}

// run runs the app until SIGINT or SIGTERM and returns the exit code.
func run() int { return orders.Main(appOptions) }

// appOptions is the whole app as one fx option, so that main and the tests
// build exactly the same graph: the frame of the examples (the library on
// the PostgreSQL store, the HTTP server) serving the Connect handlers.
func appOptions(cfg orders.Config) fx.Option {
	return orders.Options(cfg, fx.Provide(newPayments, fx.Annotate(newMux, fx.As(new(http.Handler)))))
}
