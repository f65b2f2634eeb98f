package idempotency_test

import (
	"context"
	"slices"
	"strings"
	"testing"

	"go.opentelemetry.io/otel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/fx"
	"go.uber.org/fx/fxtest"
	"go.uber.org/zap"

	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/coordinator"
	idemfxtest "github.com/idemkit/idempotency/fxtest"
	"github.com/idemkit/idempotency/internal/telemetry"
	"github.com/idemkit/idempotency/observability"
)

// tracerProvider returns a TracerProvider of the SDK that records ended
// spans in the returned recorder.
func tracerProvider(t *testing.T) (*sdktrace.TracerProvider, *tracetest.SpanRecorder) {
	t.Helper()
	sr := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(sr))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	return tp, sr
}

// tracedApp starts an app of Module on an in-memory store with opts, and
// returns its coordinator.
func tracedApp(t *testing.T, opts ...fx.Option) *coordinator.Coordinator {
	t.Helper()
	_, regOpt := registry()
	var c *coordinator.Coordinator
	app := fxtest.New(t, append([]fx.Option{
		idempotency.Module,
		idemfxtest.IgnoreEnvironment(),
		idemfxtest.MemoryStore(),
		regOpt,
		fx.Supply(zap.NewNop()),
		fx.Populate(&c),
	}, opts...)...)
	app.RequireStart()
	t.Cleanup(app.RequireStop)
	return c
}

// callTwice makes two calls of one key, each under a span of tp named
// "first" and "second".
func callTwice(t *testing.T, tp trace.TracerProvider, c *coordinator.Coordinator) {
	t.Helper()
	for _, name := range []string{"first", "second"} {
		ctx, span := tp.Tracer("test").Start(t.Context(), name)
		_, err := coordinator.Do(ctx, c, coordinator.Call{Operation: "payment.charge", Key: "order-42"},
			func(context.Context) (string, error) { return "ch_1", nil })
		span.End()
		if err != nil {
			t.Fatal(err)
		}
	}
}

// spanAttrs returns the attributes of the ended span named name, and the
// names of its events.
func spanAttrs(t *testing.T, sr *tracetest.SpanRecorder, name string) (map[string]string, []string) {
	t.Helper()
	for _, s := range sr.Ended() {
		if s.Name() != name {
			continue
		}
		a := map[string]string{}
		for _, kv := range s.Attributes() {
			a[string(kv.Key)] = kv.Value.String()
		}
		var events []string
		for _, e := range s.Events() {
			events = append(events, e.Name)
		}
		return a, events
	}
	t.Fatalf("no span %q", name)
	return nil, nil
}

// provided supplies tp to the graph as trace.TracerProvider, and as itself.
func provided(tp *sdktrace.TracerProvider) fx.Option {
	return fx.Supply(fx.Annotate(tp, fx.As(fx.Self()), fx.As(new(trace.TracerProvider))))
}

func TestModuleTracesWithAProvider(t *testing.T) {
	t.Run("supplied", func(t *testing.T) {
		clearEnv(t)
		tp, sr := tracerProvider(t)
		testTraces(t, tp, sr, tracedApp(t, provided(tp)))
	})
	t.Run("provided as docs/tracing.md shows", func(t *testing.T) {
		clearEnv(t)
		tp, sr := tracerProvider(t)
		newTracerProvider := func() *sdktrace.TracerProvider { return tp }
		testTraces(t, tp, sr, tracedApp(t, fx.Provide(fx.Annotate(newTracerProvider, fx.As(fx.Self()), fx.As(new(trace.TracerProvider))))))
	})
}

// testTraces checks that c records two calls on their spans.
func testTraces(t *testing.T, tp trace.TracerProvider, sr *tracetest.SpanRecorder, c *coordinator.Coordinator) {
	t.Helper()
	callTwice(t, tp, c)

	for _, tt := range []struct {
		span, outcome, replayed, event string
	}{
		{"first", "miss", "false", "idempotency.miss"},
		{"second", "hit", "true", "idempotency.hit"},
	} {
		a, events := spanAttrs(t, sr, tt.span)
		if a["idempotency.outcome"] != tt.outcome || a["idempotency.replayed"] != tt.replayed ||
			a["idempotency.operation"] != "payment.charge" || a["idempotency.key_hash"] != telemetry.KeyHash("order-42") {
			t.Errorf("%s: attributes %v, want outcome %s, replayed %s and the key's hash", tt.span, a, tt.outcome, tt.replayed)
		}
		if !slices.Contains(events, tt.event) || !slices.Contains(events, "idempotency.storage_call") {
			t.Errorf("%s: events %v, want %s and storage calls", tt.span, events, tt.event)
		}
	}
	if n := len(sr.Ended()); n != 2 {
		t.Errorf("%d spans; the module makes no store spans", n)
	}
}

// An app that only sets the global provider (otel.SetTracerProvider), as
// OpenTelemetry's getting-started guides do, gets the events.
func TestModuleTracesWithTheGlobalProvider(t *testing.T) {
	clearEnv(t)
	tp, sr := tracerProvider(t)
	prev := otel.GetTracerProvider()
	otel.SetTracerProvider(tp)
	t.Cleanup(func() { otel.SetTracerProvider(prev) })
	testTraces(t, otel.GetTracerProvider(), sr, tracedApp(t))
}

// The events land on the span of the call's context whatever provider
// started it, so a provider that fx does not see as trace.TracerProvider
// (docs/testing.md) loses nothing.
func TestModuleTracesSpansOfAnyProvider(t *testing.T) {
	for _, tt := range []struct {
		name string
		opts func(*sdktrace.TracerProvider) []fx.Option
	}{
		{"no provider in the graph", func(*sdktrace.TracerProvider) []fx.Option { return nil }},
		{"provider as *sdktrace.TracerProvider only (fx matches types exactly)", func(tp *sdktrace.TracerProvider) []fx.Option {
			return []fx.Option{fx.Supply(tp)}
		}},
		{"both types in one fx.As, which provides the first only (docs/testing.md)", func(tp *sdktrace.TracerProvider) []fx.Option {
			return []fx.Option{fx.Supply(fx.Annotate(tp, fx.As(fx.Self(), new(trace.TracerProvider))))}
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			clearEnv(t)
			tp, sr := tracerProvider(t)
			testTraces(t, tp, sr, tracedApp(t, tt.opts(tp)...))
		})
	}
}

// IDEMPOTENCY_TRACING_ENABLED=false leaves spans alone, with a provider in
// the graph or a global one.
func TestModuleDoesNotTraceWhenTracingIsOff(t *testing.T) {
	off := idempotency.OverrideSettings(func(s *idempotency.Settings) { s.TracingEnabled = false })
	for _, tt := range []struct {
		name   string
		global bool
		opts   func(*sdktrace.TracerProvider) []fx.Option
	}{
		{"provider in the graph", false, func(tp *sdktrace.TracerProvider) []fx.Option { return []fx.Option{provided(tp), off} }},
		{"global provider", true, func(*sdktrace.TracerProvider) []fx.Option { return []fx.Option{off} }},
	} {
		t.Run(tt.name, func(t *testing.T) {
			clearEnv(t)
			tp, sr := tracerProvider(t)
			if tt.global {
				prev := otel.GetTracerProvider()
				otel.SetTracerProvider(tp)
				t.Cleanup(func() { otel.SetTracerProvider(prev) })
			}
			c := tracedApp(t, tt.opts(tp)...)
			callTwice(t, tp, c)
			for _, name := range []string{"first", "second"} {
				if a, events := spanAttrs(t, sr, name); len(a) != 0 || len(events) != 0 {
					t.Errorf("%s: attributes %v, events %v; want none", name, a, events)
				}
			}
		})
	}
}

// IDEMPOTENCY_LOG_KEYS=omitted keeps the key's hash off spans too.
func TestModuleTracingFollowsLogKeysOmitted(t *testing.T) {
	for _, mode := range []observability.LogKeysMode{observability.LogKeysHashed, observability.LogKeysPlain, observability.LogKeysOmitted} {
		t.Run(mode.String(), func(t *testing.T) {
			clearEnv(t)
			tp, sr := tracerProvider(t)
			c := tracedApp(t, provided(tp), idempotency.OverrideSettings(func(s *idempotency.Settings) { s.LogKeys = mode }))
			callTwice(t, tp, c)
			a, _ := spanAttrs(t, sr, "first")
			h, ok := a["idempotency.key_hash"]
			if mode == observability.LogKeysOmitted && ok || mode != observability.LogKeysOmitted && h != telemetry.KeyHash("order-42") {
				t.Errorf("LOG_KEYS %s: idempotency.key_hash = %q (set: %v)", mode, h, ok)
			}
			for _, v := range a {
				if strings.Contains(v, "order-42") {
					t.Errorf("LOG_KEYS %s: the key is on the span: %v", mode, a)
				}
			}
		})
	}
}

func TestTracingEnabledSetting(t *testing.T) {
	for _, tt := range []struct {
		value   *string
		want    bool
		wantErr string
	}{
		{nil, true, ""},
		{ptr("true"), true, ""},
		{ptr("false"), false, ""},
		{ptr("0"), false, ""},
		{ptr("maybe"), false, `IDEMPOTENCY_TRACING_ENABLED: "maybe" is not a boolean; use true or false`},
		{ptr(""), false, `IDEMPOTENCY_TRACING_ENABLED: "" is not a boolean`},
	} {
		name := "unset"
		if tt.value != nil {
			name = *tt.value
		}
		t.Run(name, func(t *testing.T) {
			clearEnv(t)
			if tt.value != nil {
				t.Setenv("IDEMPOTENCY_TRACING_ENABLED", *tt.value)
			}
			s, err := idempotency.LoadSettings()
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("LoadSettings() error = %v, want one containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if s.TracingEnabled != tt.want {
				t.Errorf("TracingEnabled = %v, want %v", s.TracingEnabled, tt.want)
			}
		})
	}
	if !idempotency.DefaultSettings().TracingEnabled {
		t.Error("DefaultSettings().TracingEnabled is false, want true")
	}
}

func ptr(s string) *string { return &s }
