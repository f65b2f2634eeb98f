package idempg_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/idemkit/idempotency/coordinator/idemstore"

	"github.com/idemkit/idempotency/coordinator"
	"github.com/idemkit/idempotency/idemconsume"
	"github.com/idemkit/idempotency/idemhttp"
	"github.com/idemkit/idempotency/idempg"
)

// The HTTP middleware over the store runs its handler inside the claim's
// transaction: what the handler writes through idempg.Tx commits with the
// response and the record, a 5xx rolls it back and frees the key, and a
// commit that fails is a 503 problem, never the handler's 201.
func TestMiddlewareInsideTheTransaction(t *testing.T) {
	db := newDB(t, 8)
	c := db.coord(t)
	status := http.StatusCreated
	var mu sync.Mutex
	h := idemhttp.Middleware(c)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tx, ok := idempg.Tx(r.Context())
		if !ok {
			http.Error(w, "no transaction", http.StatusInternalServerError)
			return
		}
		key := r.Header.Get(idemhttp.KeyHeader)
		if err := insertLedger(r.Context(), tx, key, "http"); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		mu.Lock()
		defer mu.Unlock()
		w.WriteHeader(status)
		_, _ = w.Write([]byte("done"))
	}))
	post := func(key string) *httptest.ResponseRecorder {
		req := httptest.NewRequestWithContext(t.Context(), http.MethodPost, "/orders", strings.NewReader("{}"))
		req.Header.Set(idemhttp.KeyHeader, key)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		return w
	}

	key := uniqueKey("http")
	for i := range 3 {
		if w := post(key); w.Code != http.StatusCreated || (i > 0) != (w.Header().Get(idemhttp.ReplayedHeader) == "true") {
			t.Fatalf("call %d: %d %v %s", i, w.Code, w.Header(), w.Body)
		}
	}
	if n := db.ledger(t, key); n != 1 {
		t.Errorf("%d ledger rows, want 1", n)
	}

	// A 5xx is not stored: its writes roll back, and a retry runs.
	failing := uniqueKey("http-5xx")
	mu.Lock()
	status = http.StatusBadGateway
	mu.Unlock()
	if w := post(failing); w.Code != http.StatusBadGateway {
		t.Fatalf("5xx: %d %s", w.Code, w.Body)
	}
	if n := db.ledger(t, failing); n != 0 {
		t.Errorf("a 5xx left %d ledger rows, want 0: rolled back", n)
	}
	if rec := record(t, db.store(t), idemhttp.DefaultOperation, failing); rec.State != idemstore.StateAbsent {
		t.Errorf("a 5xx left a record %v, want the key free", rec.State)
	}
	mu.Lock()
	status = http.StatusCreated
	mu.Unlock()
	if w := post(failing); w.Code != http.StatusCreated || db.ledger(t, failing) != 1 {
		t.Errorf("the retry of a 5xx: %d, %d ledger rows; want 201 and 1", w.Code, db.ledger(t, failing))
	}

	// The completion fails in the transaction (a trigger refuses it): the
	// client hears 503, not the handler's 201, and nothing stays.
	db.failOn(t, "UPDATE", "http-commit", "XX000", 1000)
	broken := uniqueKey("http-commit")
	w := post(broken)
	if w.Code == http.StatusCreated || db.ledger(t, broken) != 0 {
		t.Fatalf("a failed commit answered %d %s with %d ledger rows, want a 503 problem and none", w.Code, w.Body, db.ledger(t, broken))
	}
	if w.Code != http.StatusServiceUnavailable || w.Header().Get("Content-Type") != "application/problem+json" {
		t.Errorf("a failed commit: %d %q, want a 503 problem", w.Code, w.Header().Get("Content-Type"))
	}
}

// A queue consumer over the store: its handler writes through idempg.Tx,
// and 10 deliveries of one message, 5 of them at once, make one row; a
// handler's error rolls its write back and asks for a redelivery.
func TestConsumerInsideTheTransaction(t *testing.T) {
	db := newDB(t, 8)
	c := db.coord(t)
	p, err := idemconsume.New(c, "ledger.consume")
	if err != nil {
		t.Fatal(err)
	}
	handle := func(ctx context.Context, msg idemconsume.Message) error {
		tx, ok := idempg.Tx(ctx)
		if !ok {
			return errors.New("no transaction")
		}
		if err := insertLedger(ctx, tx, msg.ID, "consumer"); err != nil {
			return err
		}
		if msg.Fields["fail"] == "yes" {
			return errors.New("downstream refused")
		}
		return nil
	}
	id := uniqueKey("msg")
	var wg sync.WaitGroup
	decisions := make([]idemconsume.Decision, 10)
	for i := range decisions {
		wg.Go(func() { decisions[i] = p.Process(t.Context(), idemconsume.Message{ID: id, Deliveries: 1}, handle) })
		if i == 4 {
			wg.Wait()
		}
	}
	wg.Wait()
	processed := 0
	for i, d := range decisions {
		if d.Action != idemconsume.Ack {
			t.Errorf("delivery %d: %v (%v), want an ack", i, d, d.Err)
		}
		if d.Reason == idemconsume.ReasonProcessed {
			processed++
		}
	}
	if processed != 1 || db.ledger(t, id) != 1 {
		t.Errorf("%d deliveries processed, %d ledger rows; want 1 and 1", processed, db.ledger(t, id))
	}
	failing := uniqueKey("msg-fail")
	d := p.Process(t.Context(), idemconsume.Message{ID: failing, Fields: map[string]string{"fail": "yes"}, Deliveries: 1}, handle)
	if d.Action != idemconsume.Retry || db.ledger(t, failing) != 0 {
		t.Errorf("a failed handler: %v with %d ledger rows, want a retry and none", d, db.ledger(t, failing))
	}

	// The handler succeeds but the commit fails (a trigger refuses the
	// completion), on the last delivery allowed: the store failed, not the
	// handler, so the message is retried, not dead-lettered, and nothing
	// stays. Once the store works again, the next delivery processes it.
	db.failOn(t, "UPDATE", "msg-commit", "XX000", 1)
	broken := uniqueKey("msg-commit")
	last := idemconsume.Message{ID: broken, Deliveries: idemconsume.DefaultMaxDeliveries}
	d = p.Process(t.Context(), last, handle)
	if d.Action != idemconsume.Retry || d.Reason != idemconsume.ReasonStorage || db.ledger(t, broken) != 0 {
		t.Fatalf("a failed commit on the last delivery: %v (%v) with %d ledger rows, want a retry (storage_error) and none", d, d.Err, db.ledger(t, broken))
	}
	if !errors.Is(d.Err, coordinator.ErrStorage) {
		t.Errorf("a failed commit: %v, want an error that matches coordinator.ErrStorage", d.Err)
	}
	d = p.Process(t.Context(), last, handle)
	if d.Action != idemconsume.Ack || d.Reason != idemconsume.ReasonProcessed || db.ledger(t, broken) != 1 {
		t.Errorf("the delivery after the failed commit: %v (%v) with %d ledger rows, want processed and 1", d, d.Err, db.ledger(t, broken))
	}
}
