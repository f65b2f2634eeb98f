package idemotel

import "go.opentelemetry.io/otel/trace"

// An Option configures an Observer; pass them to New. A nil Option is
// skipped. Every option value is accepted (nil means the default), so New
// cannot fail.
type Option interface{ apply(*config) }

type optionFunc func(*config)

func (f optionFunc) apply(c *config) { f(c) }

type config struct {
	provider   trace.TracerProvider
	storeSpans bool
	keyHash    bool
}

func defaultConfig() config { return config{keyHash: true} }

// WithTracerProvider sets the provider of the Observer's own spans, the store
// spans of WithStoreSpans. Default, and nil: the provider of the caller's span
// (trace.Span.TracerProvider), so that a store span goes where its parent
// goes. Events and attributes are always recorded on the caller's span,
// whatever its provider.
func WithTracerProvider(tp trace.TracerProvider) Option {
	return optionFunc(func(c *config) { c.provider = tp })
}

// WithStoreSpans makes each store call a child span of the caller's span,
// named "idempotency.store <method>" and timed by the call, instead of an
// idempotency.storage_call event on it. Default false: a request then has
// one span fewer per store call (two in the common case), and still shows
// each call's method, duration and result.
func WithStoreSpans(on bool) Option {
	return optionFunc(func(c *config) { c.storeSpans = on })
}

// WithKeyHash sets whether spans carry the idempotency key's hash, the
// idempotency.key_hash attribute, which is the key_hash of the log lines.
// Default true. With false, spans carry no trace of
// the key: no hash, and error messages name it as "<key>"; the operation is
// still recorded. The key itself is never recorded.
func WithKeyHash(on bool) Option {
	return optionFunc(func(c *config) { c.keyHash = on })
}
