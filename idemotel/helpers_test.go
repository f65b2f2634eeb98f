package idemotel_test

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/idemkit/idempotency/coordinator/idemevent"

	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// newProvider returns a TracerProvider of the SDK that samples every span,
// and the recorder of its ended spans.
func newProvider(t *testing.T, opts ...sdktrace.TracerProviderOption) (*sdktrace.TracerProvider, *tracetest.SpanRecorder) {
	t.Helper()
	sr := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(append([]sdktrace.TracerProviderOption{sdktrace.WithSpanProcessor(sr)}, opts...)...)
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	return tp, sr
}

// startSpan starts a span named "request", as a server adapter would.
func startSpan(t *testing.T, tp trace.TracerProvider) (context.Context, trace.Span) {
	t.Helper()
	return tp.Tracer("test").Start(t.Context(), "request", trace.WithSpanKind(trace.SpanKindServer))
}

// ended returns the ended span named name, failing the test unless there is
// exactly one.
func ended(t *testing.T, sr *tracetest.SpanRecorder, name string) sdktrace.ReadOnlySpan {
	t.Helper()
	var found []sdktrace.ReadOnlySpan
	for _, s := range sr.Ended() {
		if s.Name() == name {
			found = append(found, s)
		}
	}
	if len(found) != 1 {
		t.Fatalf("%d ended spans named %q, want 1 (all: %v)", len(found), name, names(sr.Ended()))
	}
	return found[0]
}

func names(spans []sdktrace.ReadOnlySpan) []string {
	var out []string
	for _, s := range spans {
		out = append(out, s.Name())
	}
	return out
}

// eventNames returns the names of s's events, in order.
func eventNames(s sdktrace.ReadOnlySpan) []string {
	var out []string
	for _, e := range s.Events() {
		out = append(out, e.Name)
	}
	return out
}

// attrs returns kvs as a map of their values' String forms.
func attrs(kvs []attribute.KeyValue) map[string]string {
	m := make(map[string]string, len(kvs))
	for _, kv := range kvs {
		m[string(kv.Key)] = kv.Value.String()
	}
	return m
}

// event returns the only event of s named name, failing the test otherwise.
func event(t *testing.T, s sdktrace.ReadOnlySpan, name string) sdktrace.Event {
	t.Helper()
	var found []sdktrace.Event
	for _, e := range s.Events() {
		if e.Name == name {
			found = append(found, e)
		}
	}
	if len(found) != 1 {
		t.Fatalf("span %q has %d events %q, want 1 (events: %v)", s.Name(), len(found), name, eventNames(s))
	}
	return found[0]
}

// wantAttrs fails the test unless got is exactly want.
func wantAttrs(t *testing.T, what string, got []attribute.KeyValue, want map[string]string) {
	t.Helper()
	g := attrs(got)
	for k, v := range want {
		if g[k] != v {
			t.Errorf("%s: %s = %q, want %q", what, k, g[k], v)
		}
	}
	for k, v := range g {
		if _, ok := want[k]; !ok {
			t.Errorf("%s: unexpected attribute %s = %q", what, k, v)
		}
	}
}

// noKey fails the test if the plain key appears in any attribute, event or
// status of spans.
func noKey(t *testing.T, spans []sdktrace.ReadOnlySpan, key string) {
	t.Helper()
	check := func(where string, kvs []attribute.KeyValue) {
		for _, kv := range kvs {
			if strings.Contains(kv.Value.String(), key) {
				t.Errorf("%s: %s = %q shows the key %q", where, kv.Key, kv.Value.String(), key)
			}
		}
	}
	for _, s := range spans {
		check(s.Name(), s.Attributes())
		for _, e := range s.Events() {
			check(s.Name()+"/"+e.Name, e.Attributes)
		}
		if strings.Contains(s.Status().Description, key) {
			t.Errorf("%s: status %q shows the key %q", s.Name(), s.Status().Description, key)
		}
	}
}

// counter is an Observer that counts the events of each kind.
type counter struct {
	ch chan idemevent.Kind
}

func newCounter() *counter { return &counter{ch: make(chan idemevent.Kind, 1024)} }

func (c *counter) Observe(_ context.Context, e idemevent.Event) { c.ch <- e.Kind }

// kinds drains the kinds seen so far.
func (c *counter) kinds() []idemevent.Kind {
	var out []idemevent.Kind
	for {
		select {
		case k := <-c.ch:
			out = append(out, k)
		default:
			return out
		}
	}
}

func count(kinds []idemevent.Kind, k idemevent.Kind) int {
	return len(slices.DeleteFunc(slices.Clone(kinds), func(x idemevent.Kind) bool { return x != k }))
}
