// Package faultproxy is a TCP proxy for tests that sits between a client
// (go-redis, say) and a real server and breaks the network between them on
// demand: the faults of a network, as opposed to those of the server, which
// the tests cause on the server itself (kill -9, SIGSTOP, DEBUG SLEEP,
// CLIENT KILL).
//
// [Start] listens on a free port of 127.0.0.1 and forwards every connection
// to the upstream address; point the client at [Proxy.Addr]. Until a fault
// is switched on, bytes pass through unchanged. Each fault is switched at
// run time, from any goroutine, and applies to new and existing connections
// unless its documentation says otherwise:
//
//   - [Proxy.SetLatency] delays every chunk both ways: a slow network, to
//     push calls past their timeouts.
//   - [Proxy.Refuse] stops listening, so that new connections are refused:
//     a server that is down, to measure how fast a call against it fails.
//   - [Proxy.Reset] aborts every open connection with a TCP RST: a crash, a
//     failover or a connection killed under a request in flight.
//   - [Proxy.Cut] drops every byte both ways without closing anything: a
//     network partition, where nothing fails, everything hangs, and only
//     the client's own timeouts end its calls. The reliability suite cuts
//     one instance off from Redis to check that a holder that can no longer
//     renew its lease stops before another instance can take its key.
//   - [Proxy.Hold] and [Proxy.Release] hold what clients send and deliver
//     it late, in the order sent ([InOrder]) or newest first
//     ([NewestFirst]): a network that delivers a request after the client
//     gave up on it and closed the connection, possibly after requests sent
//     later on other connections. The reliability suite holds a completion
//     that timed out, lets the coordinator's release go out on another
//     connection, and delivers the release before the late completion, to
//     check that a result that ran is not lost.
//
// [Proxy.Stats] counts connections and bytes, so that a test can check that
// its fault was hit (and wait, in a bounded loop, until a request is held).
// [Proxy.Close] closes the listener and every connection and returns once
// the proxy's goroutines have ended, so tests that run it stay clean under
// goleak:
//
//	p, err := faultproxy.Start(addr)
//	if err != nil {
//		t.Fatal(err)
//	}
//	t.Cleanup(func() { _ = p.Close() })
//	rdb := redis.NewClient(&redis.Options{Addr: p.Addr()})
//	p.Cut(true) // rdb's calls now time out
//
// The proxy knows nothing of the protocol it carries: it sees chunks, the
// bytes of one read from one side of a connection. Release alone uses what
// a request-response protocol does: it waits for the server to answer one
// connection's bytes before it delivers the next connection's, so that the
// order of delivery is the order in which the server applies them.
package faultproxy
