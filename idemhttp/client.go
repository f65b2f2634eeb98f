package idemhttp

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/idemkit/idempotency/coordinator"
)

// Transport is an http.RoundTripper for clients of an idempotent API: it
// gives each request of a protected method (WithClientMethods; POST and
// PATCH by default) one idempotency key, keeps that key across the
// request's retries, and waits out 409 in-progress responses. Create it
// with NewTransport; it is safe for concurrent use.
//
// The key of a request is, in this order:
//
//   - the Idempotency-Key header the request already has (SetKey, or your
//     own), sent as it is;
//   - the key that ContextWithKey put into the request's context;
//   - the downstream key of the coordinator action whose context the
//     request carries (coordinator.DownstreamKey): the same on every run of
//     the action, so that a provider that deduplicates by key charges once
//     when a lost record, a crash or a rollback runs the action again;
//   - a fresh NewKey, which the Transport writes into the request's Header.
//
// Writing the minted key into the caller's request is the one change the
// Transport makes to a request, against the RoundTripper rule that a
// transport should not modify it, on purpose: it is what makes every later
// send of the request carry the same key. Sending the same *http.Request
// again, a shallow copy of it (what http.Client and go-retryablehttp make
// per attempt), or a req.Clone made after the first send, all carry it. A
// retry loop that makes each attempt anew (http.NewRequest per attempt, or
// a req.Clone of a request that was never sent) gets a new key per attempt
// and defeats the server: give such a request its key once, before the
// loop, with SetKey(req, NewKey()) or ContextWithKey.
//
// A 409 response with a Retry-After header (Middleware's ProblemInProgress:
// the first request with the key is still running) is retried with the same
// key after the Retry-After (at least 100ms), for up to WithInProgressWait
// in total (DefaultInProgressWait, 30s), while the request's context lasts;
// the request's body is sent again from req.GetBody, so a request that has
// a body and no GetBody gets the 409. A 409 without Retry-After
// (ProblemNotReplayable), a 400 (ProblemKeyInvalid) and a 422
// (ProblemKeyReuse) are never retried: the same key gets the same answer.
// Every other response and every error is returned as it came, for the
// caller or its retry client to judge.
type Transport struct {
	base http.RoundTripper
	cfg  clientConfig
	mu   sync.Mutex // serialises reading and writing the key header of callers' requests
}

var _ http.RoundTripper = (*Transport)(nil)

// NewTransport returns a Transport that sends requests through base, or
// http.DefaultTransport when base is nil. It returns an error, joining a
// *coordinator.OptionError per refused value, when an option is invalid.
func NewTransport(base http.RoundTripper, opts ...ClientOption) (*Transport, error) {
	cfg, err := newClientConfig(opts)
	if err != nil {
		return nil, err
	}
	if base == nil {
		base = http.DefaultTransport
	}
	return &Transport{base: base, cfg: cfg}, nil
}

// minRetryDelay is the shortest wait before a 409 is retried, so that a
// server that asks for an immediate retry is not called in a tight loop.
const minRetryDelay = 100 * time.Millisecond

// RoundTrip sends req with its idempotency key, retrying a 409 in-progress
// response as the Transport's documentation describes. It returns an error,
// and sends nothing, when the key from ContextWithKey is invalid.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	if t.cfg.methodSet == nil {
		closeBody(req)
		return nil, errors.New("idemhttp: a Transport must be created with NewTransport")
	}
	if !t.cfg.methodSet[req.Method] {
		return t.base.RoundTrip(req)
	}
	req, err := t.keyed(req)
	if err != nil {
		closeBody(req)
		return nil, err
	}
	start := time.Now()
	for {
		resp, err := t.base.RoundTrip(req)
		if err != nil {
			return nil, err
		}
		d, ok := retryDelay(resp)
		if !ok || time.Since(start)+d > t.cfg.wait {
			return resp, nil
		}
		next, ok := rewound(req)
		if !ok {
			return resp, nil
		}
		_, _ = io.CopyN(io.Discard, resp.Body, 64<<10) // lets the connection be reused
		_ = resp.Body.Close()
		if err := sleep(req.Context(), d); err != nil {
			closeBody(next)
			return nil, err
		}
		req = next
	}
}

// CloseIdleConnections closes the idle connections of the base transport,
// when it has such a method, so that http.Client.CloseIdleConnections
// reaches it through the Transport.
func (t *Transport) CloseIdleConnections() {
	if ci, ok := t.base.(interface{ CloseIdleConnections() }); ok {
		ci.CloseIdleConnections()
	}
}

// keyed returns req with its key: req itself when it has the header, or got
// a minted key written into it; a copy with the header when the key comes
// from ContextWithKey or is the action's downstream key.
func (t *Transport) keyed(req *http.Request) (*http.Request, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(req.Header.Values(KeyHeader)) > 0 {
		return req, nil
	}
	if key, ok := req.Context().Value(contextKey{}).(string); ok {
		if err := coordinator.ValidateKey(key); err != nil {
			return req, fmt.Errorf("idemhttp: key from ContextWithKey: %w", err)
		}
		return withKey(req, key), nil
	}
	if key, ok := coordinator.DownstreamKey(req.Context()); ok {
		// Derived again by every run of the action, so nothing is written
		// into the caller's request.
		return withKey(req, key), nil
	}
	if req.Header == nil { // not from http.NewRequest nor through http.Client: nothing to write into
		out := req.Clone(req.Context())
		out.Header = http.Header{KeyHeader: {NewKey()}}
		return out, nil
	}
	req.Header.Set(KeyHeader, NewKey())
	return req, nil
}

// withKey returns a copy of req that sends key: the context keeps it for
// every later send, so the caller's request is left as it was.
func withKey(req *http.Request, key string) *http.Request {
	out := req.Clone(req.Context())
	out.Header.Set(KeyHeader, headerValue(key))
	return out
}

// retryDelay reports whether resp is a 409 with a Retry-After, and how long
// it asks to wait (at least minRetryDelay).
func retryDelay(resp *http.Response) (time.Duration, bool) {
	if resp.StatusCode != http.StatusConflict {
		return 0, false
	}
	v := strings.TrimSpace(resp.Header.Get("Retry-After"))
	var d time.Duration
	if s, err := strconv.ParseUint(v, 10, 32); err == nil {
		d = time.Duration(s) * time.Second
	} else if at, err := http.ParseTime(v); err == nil {
		d = time.Until(at)
	} else {
		return 0, false
	}
	return max(d, minRetryDelay), true
}

// rewound returns a copy of req to send again, with a fresh body from
// GetBody; false when req has a body and no GetBody, or GetBody fails.
func rewound(req *http.Request) (*http.Request, bool) {
	next := req.WithContext(req.Context())
	if req.Body == nil || req.Body == http.NoBody {
		return next, true
	}
	if req.GetBody == nil {
		return nil, false
	}
	body, err := req.GetBody()
	if err != nil {
		return nil, false
	}
	next.Body = body
	return next, true
}

// sleep waits for d, or returns ctx's error when it ends first.
func sleep(ctx context.Context, d time.Duration) error {
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-timer.C:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}

// closeBody closes the body of a request that will not be sent, as a
// RoundTripper must.
func closeBody(req *http.Request) {
	if req.Body != nil {
		_ = req.Body.Close()
	}
}

// headerValue returns the Idempotency-Key header value that carries key:
// the raw key, as most clients send it, or, for a key that starts with a
// double quote (which the middleware would parse as an RFC 8941 string),
// the key as an RFC 8941 string.
func headerValue(key string) string {
	if !strings.HasPrefix(key, `"`) {
		return key
	}
	return `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(key) + `"`
}

// contextKey is the context key under which ContextWithKey records the key.
type contextKey struct{}

// ContextWithKey returns a copy of ctx that carries key as the idempotency
// key of the requests made with it, replacing any key there: a Transport
// sends it in the Idempotency-Key header of every request of a protected
// method that has no such header. Use it for a key of your own (an order
// ID, a message ID, the key your caller sent you), and for a retry loop
// that makes each attempt anew: create the key once per logical request and
// make every attempt with the same context. The Transport's RoundTrip
// returns an error when key is not 1 to 255 visible ASCII characters
// (coordinator.ValidateKey).
func ContextWithKey(ctx context.Context, key string) context.Context {
	return context.WithValue(ctx, contextKey{}, key)
}

// SetKey sets req's Idempotency-Key header to key, replacing any there, so
// that the request and every copy of it made afterwards (req.Clone) carry
// the key, with or without a Transport. Call it once per logical request,
// before the retry loop. It returns an error and leaves req as it was when
// req is nil or key is not 1 to 255 visible ASCII characters
// (coordinator.ValidateKey).
func SetKey(req *http.Request, key string) error {
	if req == nil {
		return errors.New("idemhttp: SetKey: the request is nil")
	}
	if err := coordinator.ValidateKey(key); err != nil {
		return fmt.Errorf("idemhttp: SetKey: %w", err)
	}
	if req.Header == nil {
		req.Header = make(http.Header)
	}
	req.Header.Set(KeyHeader, headerValue(key))
	return nil
}

// NewKey returns a fresh idempotency key: a random (version 4) UUID from
// crypto/rand, such as "1b4e28ba-2fa1-4d3b-883f-0016d3cca427". Its 122
// random bits make it unguessable, which matters where the server keeps
// one key space for all callers; a time-ordered UUIDv7 would trade 48 of
// them for an order the server does not use, and tell when it was made.
// A Transport mints one for each request that has no key.
func NewKey() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never returns an error
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	var s [36]byte
	hex.Encode(s[0:8], b[0:4])
	s[8] = '-'
	hex.Encode(s[9:13], b[4:6])
	s[13] = '-'
	hex.Encode(s[14:18], b[6:8])
	s[18] = '-'
	hex.Encode(s[19:23], b[8:10])
	s[23] = '-'
	hex.Encode(s[24:], b[10:])
	return string(s[:])
}

// Replayed reports whether resp is a replay of a stored response: whether
// it has the Idempotent-Replayed: true header (ReplayedHeader) that
// Middleware sets on replays. It is false for a nil resp.
func Replayed(resp *http.Response) bool {
	return resp != nil && resp.Header.Get(ReplayedHeader) == "true"
}
