package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/idemkit/idempotency/idemconnect"
)

// charge is the client mode, `example charge [flags]`: it sends one Charge to
// a running server over the protocol of -protocol and prints the charge and
// whether it was replayed. It stands in for curl and grpcurl, so trying the
// example needs nothing installed.
func charge(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("example charge", flag.ContinueOnError)
	fs.SetOutput(stderr)
	addr := fs.String("addr", "127.0.0.1:8080", "the server's address")
	protocol := fs.String("protocol", "connect", "the protocol: connect, grpc or grpcweb")
	key := fs.String("key", "order-42", "the Idempotency-Key header (empty: a fresh key from the client interceptor)")
	tenant := fs.String("tenant", "acme", "the X-Tenant header, the key's scope")
	account := fs.String("account", "acct_1", "the account to charge")
	amount := fs.Int64("amount", 1999, "the amount in cents")
	currency := fs.String("currency", "EUR", "the ISO 4217 currency code")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	hc := h2cClient()
	defer hc.CloseIdleConnections()
	client, err := newClient(hc, *addr, *protocol)
	if err != nil {
		fmt.Fprintln(stderr, "example charge:", err)
		return 2
	}

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if *key != "" {
		// One key per logical request: a retry of this charge would pass
		// the same context, so the same key.
		ctx = idemconnect.ContextWithKey(ctx, *key)
	}
	msg, err := structpb.NewStruct(map[string]any{"account": *account, "amount_cents": *amount, "currency": *currency})
	if err != nil {
		fmt.Fprintln(stderr, "example charge:", err)
		return 2
	}
	req := connect.NewRequest(msg)
	req.Header().Set(tenantHeader, *tenant)
	resp, err := client.CallUnary(ctx, req)
	if err != nil {
		fmt.Fprintln(stderr, "example charge:", err)
		return 1
	}
	f := resp.Msg.GetFields()
	fmt.Fprintf(stdout, "charge %s: %d %s on %s (replayed: %t)\n", f["id"].GetStringValue(), int64(f["amount_cents"].GetNumberValue()),
		f["currency"].GetStringValue(), f["account"].GetStringValue(), resp.Header().Get(idemconnect.ReplayedHeader) == "true")
	return 0
}

// newClient returns a Charge client of the server at addr over protocol,
// with the idempotency client interceptor, on hc.
func newClient(hc *http.Client, addr, protocol string) (*connect.Client[structpb.Struct, structpb.Struct], error) {
	var opts []connect.ClientOption
	switch protocol {
	case "connect":
	case "grpc":
		opts = append(opts, connect.WithGRPC())
	case "grpcweb":
		opts = append(opts, connect.WithGRPCWeb())
	default:
		return nil, fmt.Errorf("-protocol %q: want connect, grpc or grpcweb", protocol)
	}
	ci, err := idemconnect.NewClientInterceptor(idemconnect.WithProcedures(chargeProcedure))
	if err != nil {
		return nil, err
	}
	return connect.NewClient[structpb.Struct, structpb.Struct](hc, "http://"+addr+chargeProcedure,
		append(opts, connect.WithInterceptors(ci))...), nil
}

// h2cClient returns an HTTP client that speaks HTTP/2 without TLS, as gRPC
// needs; the Connect protocol and gRPC-Web work over it too.
func h2cClient() *http.Client {
	protocols := new(http.Protocols)
	protocols.SetUnencryptedHTTP2(true)
	return &http.Client{Transport: &http.Transport{
		Protocols:   protocols,
		DialContext: (&net.Dialer{Timeout: 5 * time.Second}).DialContext,
	}}
}
