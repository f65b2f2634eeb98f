package idemhttp_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-retryablehttp"

	"github.com/idemkit/idempotency/idemhttp"
)

// lossyServer serves POST /payments behind the middleware, and loses the
// response to the first request: the handler runs and its response is
// stored, then the connection is closed before the client reads a byte, so
// the client must retry to learn the outcome.
func lossyServer(t *testing.T) (*httptest.Server, *payments) {
	t.Helper()
	c, _ := newCoordinator(t)
	h := &payments{}
	mux := route("POST /payments", h, idemhttp.Middleware(c))
	var lost atomic.Bool
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if lost.CompareAndSwap(false, true) {
			mux.ServeHTTP(httptest.NewRecorder(), r)
			conn, _, err := http.NewResponseController(w).Hijack()
			if err != nil {
				t.Error(err)
				return
			}
			_ = conn.Close()
			return
		}
		mux.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close) // closes http.DefaultTransport's idle connections too
	return srv, h
}

// checkRetried checks that resp is the replay of the one run of h.
func checkRetried(t *testing.T, resp *http.Response, err error, h *payments) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusCreated || !idemhttp.Replayed(resp) || !strings.Contains(string(b), `"pay_1"`) || h.n() != 1 {
		t.Fatalf("got %d replayed %v %s after %d runs; want the first run's 201 replayed, 1 run", resp.StatusCode, idemhttp.Replayed(resp), b, h.n())
	}
}

// The plain loop of docs/http.md runs as written: the code between the
// markers is the docs' snippet (TestClientSnippetsAreTheDocumented).
func TestClientLoopSnippetRunsAsWritten(t *testing.T) {
	srv, h := lossyServer(t)
	var got *http.Response
	run := func(ctx context.Context, api string) error {
		// snippet: begin
		tr, err := idemhttp.NewTransport(nil) // over http.DefaultTransport
		if err != nil {
			return err
		}
		client := &http.Client{Transport: tr, Timeout: 10 * time.Second}

		req, err := http.NewRequestWithContext(ctx, http.MethodPost, api+"/payments", strings.NewReader(`{"amount":1999}`))
		if err != nil {
			return err
		}
		var resp *http.Response
		for attempt := range 3 {
			if attempt > 0 {
				req.Body, _ = req.GetBody() // the body again; the key is in req.Header since the first attempt
			}
			if resp, err = client.Do(req); err == nil {
				break
			}
		}
		// snippet: end
		got = resp
		return err
	}
	err := run(t.Context(), srv.URL)
	checkRetried(t, got, err, h)
}

// The go-retryablehttp snippet of docs/http.md runs as written.
func TestClientRetryablehttpSnippetRunsAsWritten(t *testing.T) {
	srv, h := lossyServer(t)
	var (
		got    *http.Response
		client *http.Client
	)
	run := func(ctx context.Context, api string) error {
		// snippet: begin
		rc := retryablehttp.NewClient()
		tr, err := idemhttp.NewTransport(rc.HTTPClient.Transport)
		if err != nil {
			return err
		}
		rc.HTTPClient.Transport = tr

		req, err := retryablehttp.NewRequestWithContext(ctx, http.MethodPost, api+"/payments", strings.NewReader(`{"amount":1999}`))
		if err != nil {
			return err
		}
		resp, err := rc.Do(req) // each retry copies req, key included
		// snippet: end
		got, client = resp, rc.HTTPClient
		return err
	}
	err := run(t.Context(), srv.URL)
	if client != nil {
		defer client.CloseIdleConnections() // reaches retryablehttp's pooled transport through the Transport
	}
	checkRetried(t, got, err, h)
}

// docs/http.md shows the snippets above as they are, so that what a user
// copies is what the tests run.
func TestClientSnippetsAreTheDocumented(t *testing.T) {
	src, err := os.ReadFile("client_snippet_test.go")
	if err != nil {
		t.Fatal(err)
	}
	doc, err := os.ReadFile("../docs/http.md")
	if err != nil {
		t.Fatal(err)
	}
	rest, n := string(src), 0
	for {
		_, after, ok := strings.Cut(rest, "// snippet: begin\n")
		if !ok {
			break
		}
		code, after, ok := strings.Cut(after, "\t\t// snippet: end\n")
		if !ok {
			t.Fatal("a snippet has no end")
		}
		rest, n = after, n+1
		var lines []string
		for line := range strings.SplitSeq(strings.TrimSuffix(code, "\n"), "\n") {
			line = strings.TrimPrefix(line, "\t\t")
			indent := len(line) - len(strings.TrimLeft(line, "\t"))
			lines = append(lines, strings.Repeat("    ", indent)+line[indent:])
		}
		snippet := "```go\n" + strings.Join(lines, "\n") + "\n```\n"
		if !strings.Contains(string(doc), snippet) {
			t.Errorf("docs/http.md does not show snippet %d as it is:\n%s", n, snippet)
		}
	}
	if n != 2 {
		t.Fatalf("found %d snippets, want 2", n)
	}
}
