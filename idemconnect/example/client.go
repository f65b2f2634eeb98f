package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/idemkit/idempotency/idemconnect"
)

// charge is the client mode, `example charge [flags]`: it sends one Charge to
// a running server over the protocol of -protocol and prints the charge and
// whether it was replayed. It stands in for curl and grpcurl, so trying the
// example needs nothing installed.
//
// It retries, as a client of a payment API should: an attempt that times
// out (-timeout), or that the server refuses with Aborted (the first call
// with the key still runs) or Unavailable, is made again, up to -attempts,
// after the delay of the refusal's RetryInfo. Every attempt carries the same
// key: it is made once, before the first attempt, and put into the context
// that every attempt derives its own deadline from
// (idemconnect.ContextWithKey), which the client interceptor reads. So the
// server runs the charge once, however many attempts it takes.
func charge(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("example charge", flag.ContinueOnError)
	fs.SetOutput(stderr)
	addr := fs.String("addr", "127.0.0.1:8080", "the server's address")
	protocol := fs.String("protocol", "connect", "the protocol: connect, grpc or grpcweb")
	key := fs.String("key", "order-42", "the Idempotency-Key header (empty: a fresh key, idemconnect.NewKey, kept by every attempt)")
	tenant := fs.String("tenant", "acme", "the X-Tenant header, the key's scope")
	account := fs.String("account", "acct_1", "the account to charge")
	amount := fs.Int64("amount", 1999, "the amount in cents")
	currency := fs.String("currency", "EUR", "the ISO 4217 currency code")
	timeout := fs.Duration("timeout", 5*time.Second, "how long each attempt may take")
	attempts := fs.Int("attempts", 5, "how many attempts to make, all with the same key")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *timeout <= 0 || *attempts < 1 {
		fmt.Fprintf(stderr, "example charge: -timeout %v -attempts %d: want a positive timeout and at least one attempt\n", *timeout, *attempts)
		return 2
	}
	hc := h2cClient()
	defer hc.CloseIdleConnections()
	client, err := newClient(hc, *addr, *protocol)
	if err != nil {
		fmt.Fprintln(stderr, "example charge:", err)
		return 2
	}
	msg, err := structpb.NewStruct(map[string]any{"account": *account, "amount_cents": *amount, "currency": *currency})
	if err != nil {
		fmt.Fprintln(stderr, "example charge:", err)
		return 2
	}

	// One key per logical request, made before the first attempt: every
	// attempt's context derives from ctx, so every attempt carries it.
	k := *key
	if k == "" {
		k = idemconnect.NewKey()
	}
	ctx := idemconnect.ContextWithKey(context.Background(), k)
	var resp *connect.Response[structpb.Struct]
	for attempt := 1; ; attempt++ {
		actx, cancel := context.WithTimeout(ctx, *timeout)
		req := connect.NewRequest(msg)
		req.Header().Set(tenantHeader, *tenant)
		resp, err = client.CallUnary(actx, req)
		cancel()
		if err == nil {
			break
		}
		if !retryable(err) || attempt == *attempts {
			fmt.Fprintf(stderr, "example charge: attempt %d: %v\n", attempt, err)
			return 1
		}
		delay := retryDelay(err)
		fmt.Fprintf(stderr, "example charge: attempt %d: %v; retrying in %v with the same key, %s\n", attempt, err, delay, k)
		time.Sleep(delay)
	}
	f := resp.Msg.GetFields()
	fmt.Fprintf(stdout, "charge %s: %d %s on %s for %s (replayed: %t)\n", f["id"].GetStringValue(), int64(f["amount_cents"].GetNumberValue()),
		f["currency"].GetStringValue(), f["account"].GetStringValue(), f["tenant"].GetStringValue(),
		resp.Header().Get(idemconnect.ReplayedHeader) == "true")
	return 0
}

// retryable reports whether an attempt that failed with err may be made
// again with the same key: it timed out, or the server said to try again.
// Its charge ran once at most, and the next attempt gets that charge or
// makes it.
func retryable(err error) bool {
	switch connect.CodeOf(err) {
	case connect.CodeDeadlineExceeded, connect.CodeAborted, connect.CodeUnavailable:
		return true
	}
	return false
}

// retryDelay is how long to wait before the next attempt: the delay of the
// error's google.rpc.RetryInfo (the interceptor's Aborted and Unavailable
// have one), else 100ms.
func retryDelay(err error) time.Duration {
	var ce *connect.Error
	if errors.As(err, &ce) {
		for _, d := range ce.Details() {
			if v, _ := d.Value(); v != nil {
				if ri, ok := v.(*errdetails.RetryInfo); ok && ri.GetRetryDelay().AsDuration() > 0 {
					return ri.GetRetryDelay().AsDuration()
				}
			}
		}
	}
	return 100 * time.Millisecond
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
