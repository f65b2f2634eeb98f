package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"slices"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"

	"github.com/idemkit/idempotency/idemgrpc"
	"github.com/idemkit/idempotency/idemgrpc/internal/paymentspb"
)

// charge is the client mode, `example charge [flags]`: it sends one Charge to
// a running server and prints the charge and whether it was replayed. It
// stands in for grpcurl, so trying the example needs nothing installed.
func charge(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("example charge", flag.ContinueOnError)
	fs.SetOutput(stderr)
	addr := fs.String("addr", "127.0.0.1:50051", "the server's address")
	key := fs.String("key", "order-42", "the idempotency-key metadata entry (empty: none)")
	tenant := fs.String("tenant", "acme", "the x-tenant metadata entry, the key's scope")
	account := fs.String("account", "acct_1", "the account to charge")
	amount := fs.Int64("amount", 1999, "the amount in cents")
	currency := fs.String("currency", "EUR", "the ISO 4217 currency code")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	conn, err := grpc.NewClient(*addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		fmt.Fprintln(stderr, "example charge:", err)
		return 1
	}
	defer conn.Close()

	md := metadata.Pairs(tenantHeader, *tenant)
	if *key != "" {
		md.Set(idemgrpc.DefaultKeyHeader, *key)
	}
	ctx, cancel := context.WithTimeout(metadata.NewOutgoingContext(context.Background(), md), 10*time.Second)
	defer cancel()
	var header metadata.MD
	c, err := paymentspb.NewPaymentsClient(conn).Charge(ctx, &paymentspb.ChargeRequest{
		Account: *account, AmountCents: *amount, Currency: *currency,
	}, grpc.Header(&header))
	if err != nil {
		fmt.Fprintln(stderr, "example charge:", err)
		return 1
	}
	replayed := slices.Equal(header.Get(idemgrpc.ReplayedHeader), []string{"true"})
	fmt.Fprintf(stdout, "charge %s: %d %s on %s (replayed: %t)\n", c.GetId(), c.GetAmountCents(), c.GetCurrency(), c.GetAccount(), replayed)
	return 0
}
