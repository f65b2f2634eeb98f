package idemhttp_test

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/idemkit/idempotency/coordinator/idemstore"

	"github.com/idemkit/idempotency/coordinator"
	"github.com/idemkit/idempotency/coordinator/memstore"
	"github.com/idemkit/idempotency/idemhttp"
	"github.com/idemkit/idempotency/idemkey"
)

func TestInvalidKeyIs400(t *testing.T) {
	c, _ := newCoordinator(t)
	var p payments
	mux := route("POST /payments", &p, idemhttp.Middleware(c))
	for _, tc := range []struct{ name, key string }{
		{"too long", strings.Repeat("k", coordinator.MaxKeyLen+1)},
		{"space", "a b"},
		{"non-ASCII", "clé"},
		{"empty quoted", `""`},
		{"unterminated", `"abc`},
		{"bad escape", `"a\b"`},
		{"text after quote", `"abc"x`},
		{"parameter without a name", `"abc";=1`},
		{"parameter with an upper-case name", `"abc";P=1`},
		{"parameter without a value", `"abc";p=`},
		{"parameters without a semicolon", `"abc" ;p=1`},
		{"space before =", `"abc";p =1`},
		{"bad escape in a parameter", `"abc";p="a\b"`},
		{"unterminated parameter string", `"abc";p="x`},
		{"bad boolean", `"abc";p=?2`},
		{"unterminated byte sequence", `"abc";p=:aGk=`},
		{"bad byte sequence", `"abc";p=:a b:`},
		{"integer too long", `"abc";p=1234567890123456`},
		{"decimal with a trailing dot", `"abc";p=1.`},
		{"decimal without an integer part", `"abc";p=-.5`},
		{"decimal with 4 fraction digits", `"abc";p=1.2345`},
		{"two dots", `"abc";p=1.2.3`},
		{"text after a parameter", `"abc";p=1 x`},
		{"trailing semicolon", `"abc";`},
		{"list", `"a", "b"`},
		{"space in quotes", `"a b"`},
		{"long quoted", `"` + strings.Repeat("k", coordinator.MaxKeyLen+1) + `"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := send(mux, "POST", "/payments", tc.key, `{}`)
			problemOf(t, w, http.StatusBadRequest, idemhttp.ProblemKeyInvalid)
		})
	}
	t.Run("empty", func(t *testing.T) {
		r := httptest.NewRequest("POST", "/payments", nil)
		r.Header[idemhttp.KeyHeader] = []string{""}
		w := httptest.NewRecorder()
		mux.ServeHTTP(w, r)
		problemOf(t, w, http.StatusBadRequest, idemhttp.ProblemKeyInvalid)
	})
	t.Run("two headers", func(t *testing.T) {
		w := send(mux, "POST", "/payments", "k1", `{}`, idemhttp.KeyHeader, "k2")
		problemOf(t, w, http.StatusBadRequest, idemhttp.ProblemKeyInvalid)
	})
	t.Run("two equal headers", func(t *testing.T) {
		w := send(mux, "POST", "/payments", "k1", `{}`, idemhttp.KeyHeader, "k1")
		problemOf(t, w, http.StatusBadRequest, idemhttp.ProblemKeyInvalid)
	})
	if p.n() != 0 {
		t.Fatalf("handler ran %d times for invalid keys, want 0", p.n())
	}
}

func TestLongestKeyIsAccepted(t *testing.T) {
	c, _ := newCoordinator(t)
	var p payments
	mux := route("POST /payments", &p, idemhttp.Middleware(c))
	key := strings.Repeat("k", coordinator.MaxKeyLen)
	send(mux, "POST", "/payments", key, `{}`)
	if w := send(mux, "POST", "/payments", key, `{}`); w.Code != http.StatusCreated || !isReplay(w) {
		t.Fatalf("retry = %d, replayed %v; want a 201 replay", w.Code, isReplay(w))
	}
}

func TestQuotedKeyEqualsRawKey(t *testing.T) {
	c, _ := newCoordinator(t)
	var p payments
	mux := route("POST /payments", &p, idemhttp.Middleware(c))
	for _, tc := range []struct{ name, first, retry string }{
		{"quoted then raw", `"abc"`, `abc`},
		{"raw then quoted", `xyz`, `"xyz"`},
		{"escaped quote", `"a\"b"`, `a"b`},
		{"escaped backslash", `"c\\d"`, `c\d`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			first := send(mux, "POST", "/payments", tc.first, `{}`)
			if first.Code != http.StatusCreated || isReplay(first) {
				t.Fatalf("first = %d, replayed %v; want a fresh 201", first.Code, isReplay(first))
			}
			retry := send(mux, "POST", "/payments", tc.retry, `{}`)
			if !isReplay(retry) || retry.Body.String() != first.Body.String() {
				t.Fatalf("retry with %s = %s (replayed %v), want the replay of %s", tc.retry, retry.Body, isReplay(retry), first.Body)
			}
		})
	}
	if p.n() != 4 {
		t.Fatalf("handler ran %d times, want 4", p.n())
	}
}

// RFC 8941 parameters after a quoted key are checked and ignored: they do
// not change the key.
func TestQuotedKeyParametersAreIgnored(t *testing.T) {
	c, _ := newCoordinator(t)
	var p payments
	mux := route("POST /payments", &p, idemhttp.Middleware(c))
	first := send(mux, "POST", "/payments", "abc", `{}`)
	for _, key := range []string{
		`"abc";p=1`,
		`"abc";p`,
		`"abc"; a=1;b=?0;*c=-12.5;d="x;\"y";e=:aGk=:;f=tok/en:1;g=?1`,
		`"abc";a-b.c_d*=*`,
		`"abc";p=123456789012345;q=123456789012.123`,
	} {
		w := send(mux, "POST", "/payments", key, `{}`)
		if !isReplay(w) || w.Body.String() != first.Body.String() {
			t.Errorf("%s: %d %s replayed %v; want the replay of abc", key, w.Code, w.Body, isReplay(w))
		}
	}
	if p.n() != 1 {
		t.Fatalf("handler ran %d times, want 1", p.n())
	}
}

func TestMissingKey(t *testing.T) {
	c, _ := newCoordinator(t)
	t.Run("passes through", func(t *testing.T) {
		var p payments
		mux := route("POST /payments", &p, idemhttp.Middleware(c))
		for range 2 {
			if w := send(mux, "POST", "/payments", "", `{}`); w.Code != http.StatusCreated || isReplay(w) {
				t.Fatalf("status %d, replayed %v; want a fresh 201", w.Code, isReplay(w))
			}
		}
		if p.n() != 2 {
			t.Fatalf("handler ran %d times, want 2", p.n())
		}
	})
	t.Run("400 when required", func(t *testing.T) {
		var p payments
		mux := route("/payments", &p, idemhttp.Middleware(c, idemhttp.WithKeyRequired(true)))
		problemOf(t, send(mux, "POST", "/payments", "", `{}`), http.StatusBadRequest, idemhttp.ProblemKeyMissing)
		if p.n() != 0 {
			t.Fatalf("handler ran %d times, want 0", p.n())
		}
		// Unprotected methods need no key.
		if w := send(mux, "GET", "/payments", "", ""); w.Code != http.StatusCreated {
			t.Fatalf("GET without key = %d, want 201", w.Code)
		}
	})
}

func TestMethods(t *testing.T) {
	c, _ := newCoordinator(t)
	t.Run("default POST and PATCH", func(t *testing.T) {
		var p payments
		mux := route("/payments", &p, idemhttp.Middleware(c))
		for _, m := range []string{"GET", "PUT", "DELETE"} {
			for range 2 {
				if w := send(mux, m, "/payments", m+"-key", ""); isReplay(w) {
					t.Fatalf("%s was replayed; want it unprotected", m)
				}
			}
		}
		if p.n() != 6 {
			t.Fatalf("handler ran %d times, want 6", p.n())
		}
		for _, m := range []string{"POST", "PATCH"} {
			send(mux, m, "/payments", m+"-key", "")
			if w := send(mux, m, "/payments", m+"-key", ""); !isReplay(w) {
				t.Fatalf("%s retry not replayed", m)
			}
		}
		if p.n() != 8 {
			t.Fatalf("handler ran %d times, want 8", p.n())
		}
	})
	t.Run("WithMethods", func(t *testing.T) {
		var p payments
		mux := route("/payments", &p, idemhttp.Middleware(c, idemhttp.WithMethods("PUT")))
		send(mux, "PUT", "/payments", "put-key", "")
		if w := send(mux, "PUT", "/payments", "put-key", ""); !isReplay(w) {
			t.Fatal("PUT retry not replayed")
		}
		send(mux, "POST", "/payments", "post-key", "")
		if w := send(mux, "POST", "/payments", "post-key", ""); isReplay(w) {
			t.Fatal("POST replayed; want it unprotected")
		}
	})
}

func TestOperationName(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"POST /payments/{id}", "POST.payments.id"},
		{"POST /payments", "POST.payments"},
		{"/payments/", "payments"},
		{"POST /files/{path...}", "POST.files.path"},
		{"POST /{$}", "POST"},
		{"PATCH api.example.com/v1.2/orders/{order_id}/items", "PATCH.api.example.com.v1.2.orders.order_id.items"},
		{"payment.charge", "payment.charge"},
		{"", ""},
		{"/", ""},
		{"/{$}", ""},
	} {
		if got := idemhttp.OperationName(tc.in); got != tc.want {
			t.Errorf("OperationName(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
	long := "POST /" + strings.Repeat("segment/", 20)
	got := idemhttp.OperationName(long)
	if err := coordinator.ValidateOperation(got); err != nil || len(got) != coordinator.MaxOperationLen {
		t.Fatalf("OperationName(long) = %q (%d bytes, %v); want a valid %d-byte name", got, len(got), err, coordinator.MaxOperationLen)
	}
	if other := idemhttp.OperationName(long + "x"); other == got {
		t.Fatalf("two long patterns share the name %q", got)
	}
	if again := idemhttp.OperationName(long); again != got {
		t.Fatalf("OperationName is not deterministic: %q then %q", got, again)
	}
}

func TestOperationFromRoute(t *testing.T) {
	t.Run("pattern inside the mux", func(t *testing.T) {
		c, ev := newCoordinator(t)
		var p payments
		idem := idemhttp.Middleware(c)
		mux := http.NewServeMux()
		mux.Handle("POST /payments/{id}/capture", idem(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if id := r.PathValue("id"); id != "pay_1" {
				t.Errorf("PathValue(id) = %q, want pay_1", id)
			}
			p.ServeHTTP(w, r)
		})))
		mux.Handle("POST /refunds", idem(&p))
		send(mux, "POST", "/payments/pay_1/capture", "k", "")
		send(mux, "POST", "/refunds", "k", "") // the same key on another route: another operation
		got := ev.operations()
		if len(got) != 2 || got[0] != "POST.payments.id.capture" || got[1] != "POST.refunds" {
			t.Fatalf("operations = %q, want [POST.payments.id.capture POST.refunds]", got)
		}
	})
	t.Run("whole mux wrapped", func(t *testing.T) {
		c, ev := newCoordinator(t)
		var p payments
		mux := http.NewServeMux()
		mux.Handle("POST /payments", &p)
		mux.Handle("POST /refunds", &p)
		h := idemhttp.Middleware(c)(mux)
		send(h, "POST", "/payments", "k", "")
		// One key space for every route; the path is in the fingerprint.
		problemOf(t, send(h, "POST", "/refunds", "k", ""), http.StatusUnprocessableEntity, idemhttp.ProblemKeyReuse)
		if got := ev.operations(); len(got) != 1 || got[0] != idemhttp.DefaultOperation {
			t.Fatalf("operations = %q, want [%s]", got, idemhttp.DefaultOperation)
		}
	})
	t.Run("WithOperation", func(t *testing.T) {
		c, ev := newCoordinator(t)
		var p payments
		send(route("POST /payments", &p, idemhttp.Middleware(c, idemhttp.WithOperation("payment.create"))), "POST", "/payments", "k", "")
		if got := ev.operations(); len(got) != 1 || got[0] != "payment.create" {
			t.Fatalf("operations = %q, want [payment.create]", got)
		}
	})
	t.Run("WithOperationFunc", func(t *testing.T) {
		c, ev := newCoordinator(t)
		var p payments
		h := idemhttp.Middleware(c, idemhttp.WithOperationFunc(func(r *http.Request) string { return "v1 " + r.URL.Path }))(&p)
		send(h, "POST", "/payments", "k", "")
		if got := ev.operations(); len(got) != 1 || got[0] != "v1.payments" {
			t.Fatalf("operations = %q, want [v1.payments]", got)
		}
	})
}

// The record of a scoped request is stored under idemkey.Scoped of the
// scope and the client's key, with a fingerprint whose encoding is pinned:
// a change to either would make every retry across an upgrade run again or
// be refused as a reuse.
func TestStoredKeyAndFingerprint(t *testing.T) {
	store := memstore.New()
	c, _ := newCoordinatorOn(t, store)
	var p payments
	mux := route("POST /payments", &p, idemhttp.Middleware(c,
		idemhttp.WithKeyScope(func(*http.Request) (string, error) { return "shop_1", nil }),
		idemhttp.WithFingerprintHeaders("X-Account")))
	if w := send(mux, "POST", "/payments?a=1", "order-42", `{}`, "X-Account", "acct_1"); w.Code != http.StatusCreated {
		t.Fatalf("status %d, want 201", w.Code)
	}
	rec, err := store.Get(t.Context(), idemstore.Key{Operation: "POST.payments", Key: idemkey.Scoped("shop_1", "order-42")})
	if err != nil || rec.State != idemstore.StateCompleted {
		t.Fatalf("record under idemkey.Scoped(shop_1, order-42): %+v, %v; want a completed one", rec, err)
	}
	var enc []byte
	field := func(s string) { enc = binary.BigEndian.AppendUint64(enc, uint64(len(s))); enc = append(enc, s...) }
	field("idemhttp/1")
	field("POST")
	field("/payments")
	field("a=1")
	field("X-Account")
	enc = binary.BigEndian.AppendUint64(enc, 1)
	field("acct_1")
	field("{}")
	want := sha256.Sum256(enc)
	if rec.Fingerprint != hex.EncodeToString(want[:]) {
		t.Errorf("fingerprint %s, want %x", rec.Fingerprint, want)
	}
}
