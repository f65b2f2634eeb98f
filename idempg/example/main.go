// Command example is a transfer service that shows the PostgreSQL store in
// an fx app: POST /transfers moves money between two accounts behind the
// HTTP idempotency middleware (idemhttp), and its handler writes through the
// transaction that holds the key (idempg.Tx), so the transfer, its two
// ledger entries, the answer and the idempotency record commit in one
// transaction. A client that retries with the same Idempotency-Key gets the
// first transfer back, and a crash at any instant leaves the transfer and
// its record both, or neither: exactly once.
//
// Run it with
//
//	go run ./example           # from the idempg directory
//
// Without IDEMPOTENCY_POSTGRES_URL it starts a throwaway PostgreSQL server
// (Debian's postgresql package, initdb into a temporary directory) and says
// so; set the variable to use your own database. The app applies the
// store's schema and its own tables on start. It listens on ADDR (default
// 127.0.0.1:8080; port 0 picks a free port, the log says which). Then, from
// another terminal:
//
//	curl -i -X POST localhost:8080/transfers -H 'Idempotency-Key: t-1' \
//	    -d '{"from":"alice","to":"bob","amount":1999}'
//
// answers 201 and the transfer. The same command again answers the same 201
// and body (same transfer ID) with "Idempotent-Replayed: true": no second
// transfer. With '{"from":"alice","to":"bob","amount":5000}' it is the key
// reused for another request: a 422 problem (application/problem+json).
// Without the header: 400. Then
//
//	curl -s localhost:8080/ledger
//
// lists the ledger entries and balances: one debit and one credit per key,
// whatever the retries.
//
// The files: main.go (the fx wiring), server.go (the HTTP API and the
// transfer). The configuration, the HTTP server and the throwaway
// PostgreSQL are those of the gin, Echo and Connect examples, from the
// package orders beside it.
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
// build exactly the same graph: the frame of the examples (the library on
// the PostgreSQL store, the HTTP server) serving the bank's routes.
func appOptions(cfg orders.Config) fx.Option {
	return orders.Options(cfg, fx.Provide(newBank, fx.Annotate(newMux, fx.As(new(http.Handler)))))
}
