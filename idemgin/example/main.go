// Command example is an order service that shows idemgin in an fx app on
// the PostgreSQL store: POST /orders/:id charges an order behind the
// idempotency middleware, and the handler writes the charge through the
// transaction in which its idempotency record commits (idempg.Tx). A client
// that retries with the same Idempotency-Key gets the first charge back
// instead of a second one, and a crash at any instant leaves the charge and
// its record both, or neither. GET /ledger shows every charge really made.
//
// Run it with
//
//	go run ./example           # from the idemgin directory
//
// Without IDEMPOTENCY_POSTGRES_URL it starts a throwaway PostgreSQL server
// (Debian's postgresql package, initdb into a temporary directory, deleted
// on exit) and says so; set the variable to use your own database. It needs
// no Redis. The app applies the store's schema and its own table on start.
// It listens on ADDR (default 127.0.0.1:8080; port 0 picks a free port, the
// log says which); CHARGE_DELAY (default 50ms) is the payment provider's
// latency; LOG_LEVEL=debug logs every idempotency hit and miss and puts gin
// in debug mode. Then, from another terminal:
//
//	curl -i -X POST localhost:8080/orders/42 -H 'Idempotency-Key: order-42' \
//	    -H 'X-Tenant: acme' -d '{"amount":1999,"currency":"EUR"}'
//
// answers 201 and the charge. The same command again answers the same 201
// and the same body (same charge ID), with "Idempotent-Replayed: true": the
// order was not charged twice. With -H 'X-Tenant: globex' it is another
// tenant's key, and a new charge; with '{"amount":5000,"currency":"EUR"}' it
// is the key reused for another request, and a 422 problem
// (application/problem+json). Without the Idempotency-Key header the
// answer is 400, without X-Tenant 401. Then
//
//	curl -s localhost:8080/ledger
//
// lists the charges: one per tenant, whatever the retries.
//
// The files: main.go (the fx wiring), server.go (the gin router and its
// routes). What the gin, Echo and Connect examples share, the ledger of
// charges, the configuration, the HTTP server and the throwaway
// PostgreSQL, is the package idempg/example/orders.
package main

import (
	"net/http"
	"os"

	"go.uber.org/fx"

	"github.com/idemkit/idempotency/idempg/example/orders"
)

func main() { os.Exit(run()) }

// run runs the app until SIGINT or SIGTERM and returns the exit code.
func run() int { return orders.Main(appOptions) }

// appOptions is the whole app as one fx option, so that main and the tests
// build exactly the same graph: the order service's frame (the library on
// the PostgreSQL store, the ledger, the HTTP server) serving this router.
func appOptions(cfg orders.Config) fx.Option {
	return orders.Options(cfg, fx.Provide(fx.Annotate(newRouter, fx.As(new(http.Handler)))))
}
