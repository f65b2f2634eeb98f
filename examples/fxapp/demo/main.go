// Command demo plays a client against a running fxapp and prints what
// happened: 20 concurrent duplicate payments, a key reused for another
// payment, a redelivered refund message, and the ledger. It exits 1 when the
// service did not behave (anything but exactly one charge for the 20
// duplicates), so CI can run it. `make demo` starts the service and runs it:
//
//	go run ./examples/fxapp/demo http://127.0.0.1:8080
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"time"
)

const (
	duplicates = 20
	tenant     = "shop_1"
	payment    = `{"account":"acc_1","amount":1999,"currency":"EUR"}`
	otherBody  = `{"account":"acc_1","amount":5000,"currency":"EUR"}`
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: demo http://host:port")
		os.Exit(2)
	}
	d := &demo{base: strings.TrimRight(os.Args[1], "/"), client: &http.Client{Timeout: 10 * time.Second}}
	if err := d.run(); err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
	if len(d.failures) > 0 {
		fmt.Println("\nFAIL:")
		for _, f := range d.failures {
			fmt.Println("  -", f)
		}
		os.Exit(1)
	}
	fmt.Printf("\nPASS: %d requests with one key, 1 charge.\n", duplicates+1)
}

type demo struct {
	base     string
	client   *http.Client
	failures []string
}

// check records a failure when ok is false.
func (d *demo) check(ok bool, format string, args ...any) {
	if !ok {
		d.failures = append(d.failures, fmt.Sprintf(format, args...))
	}
}

func (d *demo) run() error {
	if err := d.waitReady(10 * time.Second); err != nil {
		return err
	}
	before, err := d.ledger()
	if err != nil {
		return err
	}
	fmt.Printf("idemkit demo against %s (tenant %s)\n", d.base, tenant)

	key := fmt.Sprintf("demo-%d", time.Now().UnixNano())
	first, err := d.duplicatePayments(key)
	if err != nil {
		return err
	}
	if err := d.keyReuse(key); err != nil {
		return err
	}
	if err := d.redeliveredRefund(before, first); err != nil {
		return err
	}
	return d.showLedger(before, first)
}

// duplicatePayments sends the same payment with one key from 20 goroutines
// at once, as a client that times out and retries aggressively would, and
// returns the charge ID of the response.
func (d *demo) duplicatePayments(key string) (string, error) {
	fmt.Printf("\n1. %d concurrent POST /payments, Idempotency-Key %s, same body\n", duplicates, key)
	responses := make([]result, duplicates)
	errs := make([]error, duplicates)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range duplicates {
		wg.Go(func() {
			<-start
			responses[i], errs[i] = d.post("/payments", key, payment)
		})
	}
	began := time.Now()
	close(start)
	wg.Wait()
	took := time.Since(began)
	for _, err := range errs {
		if err != nil {
			return "", err
		}
	}

	// Count by status, then fresh (handler ran) and replayed.
	type tally struct{ all, replayed int }
	byStatus := map[int]*tally{}
	identical := true
	for _, r := range responses {
		t := byStatus[r.status]
		if t == nil {
			t = &tally{}
			byStatus[r.status] = t
		}
		t.all++
		if r.header.Get("Idempotent-Replayed") == "true" {
			t.replayed++
		}
		identical = identical && r.body == responses[0].body
	}
	statuses := make([]int, 0, len(byStatus))
	for s := range byStatus {
		statuses = append(statuses, s)
	}
	slices.Sort(statuses)
	for _, s := range statuses {
		t := byStatus[s]
		fmt.Printf("   %d x%d (%d fresh, %d replayed with Idempotent-Replayed: true)\n", s, t.all, t.all-t.replayed, t.replayed)
	}
	if identical {
		fmt.Printf("   all %d bodies identical: %s\n", duplicates, compact(responses[0].body))
	} else {
		fmt.Printf("   bodies differ\n")
	}
	fmt.Printf("   took %v\n", took.Round(time.Millisecond))

	created := byStatus[http.StatusCreated]
	d.check(created != nil && created.all == duplicates, "not all %d responses are 201", duplicates)
	d.check(created != nil && created.replayed == duplicates-1, "want exactly %d replayed responses", duplicates-1)
	d.check(identical, "the %d responses do not have identical bodies", duplicates)

	var c struct {
		ID string `json:"id"`
	}
	_ = json.Unmarshal([]byte(responses[0].body), &c)
	return c.ID, nil
}

// keyReuse sends another payment with the same key.
func (d *demo) keyReuse(key string) error {
	fmt.Println("\n2. The same key with another body (amount 5000 instead of 1999)")
	r, err := d.post("/payments", key, otherBody)
	if err != nil {
		return err
	}
	fmt.Printf("   %d %s (%s)\n", r.status, http.StatusText(r.status), r.header.Get("Content-Type"))
	fmt.Printf("   %s\n", compact(r.body))
	d.check(r.status == http.StatusUnprocessableEntity, "key reuse: status %d, want 422", r.status)
	return nil
}

// redeliveredRefund publishes one refund message twice, as a broker that
// redelivers would, and waits until the consumer has taken both deliveries.
func (d *demo) redeliveredRefund(before ledger, chargeID string) error {
	msgID := fmt.Sprintf("refund-%d", time.Now().UnixNano())
	fmt.Printf("\n3. Refund message %s delivered twice to the queue consumer (coordinator.DoResult)\n", msgID)
	msg := fmt.Sprintf(`{"id":%q,"charge_id":%q,"amount":500}`, msgID, chargeID)
	for range 2 {
		r, err := d.post("/refunds", "", msg)
		if err != nil {
			return err
		}
		if r.status != http.StatusAccepted {
			return fmt.Errorf("POST /refunds: %d %s", r.status, compact(r.body))
		}
	}
	var q queueStats
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		l, err := d.ledger()
		if err != nil {
			return err
		}
		if q = l.Queue.minus(before.Queue); q.Delivered >= 2 {
			break
		}
	}
	fmt.Printf("   delivered %d, processed %d, duplicates %d, failed %d\n", q.Delivered, q.Processed, q.Duplicates, q.Failed)
	d.check(q == queueStats{Delivered: 2, Processed: 1, Duplicates: 1}, "refund: want 2 deliveries, 1 processed, 1 duplicate")
	return nil
}

// showLedger prints what the ledger gained during the demo.
func (d *demo) showLedger(before ledger, chargeID string) error {
	after, err := d.ledger()
	if err != nil {
		return err
	}
	charges := after.Charges[len(before.Charges):]
	refunds := after.Refunds[len(before.Refunds):]
	fmt.Printf("\n4. GET /ledger: the real effects\n")
	fmt.Printf("   charges: %d\n", len(charges))
	for _, c := range charges {
		fmt.Printf("     %s  %s  %s  %s\n", c.ID, c.Tenant, c.Account, money(c.Amount, c.Currency))
	}
	fmt.Printf("   refunds: %d\n", len(refunds))
	for _, r := range refunds {
		fmt.Printf("     %s  of %s  %s  (message %s)\n", r.ID, r.ChargeID, money(r.Amount, ""), r.MessageID)
	}
	d.check(len(charges) == 1, "the ledger shows %d new charges, want exactly 1", len(charges))
	d.check(len(charges) != 1 || charges[0].ID == chargeID, "the ledger's charge is not the one the responses returned")
	d.check(len(refunds) == 1, "the ledger shows %d new refunds, want exactly 1", len(refunds))
	return nil
}

// result is an HTTP response, read.
type result struct {
	status int
	header http.Header
	body   string
}

// post sends body to path, with an Idempotency-Key when key is not empty.
func (d *demo) post(path, key, body string) (result, error) {
	req, err := http.NewRequestWithContext(context.Background(), "POST", d.base+path, strings.NewReader(body))
	if err != nil {
		return result{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Tenant", tenant)
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	return d.do(req)
}

func (d *demo) do(req *http.Request) (result, error) {
	resp, err := d.client.Do(req)
	if err != nil {
		return result{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return result{}, fmt.Errorf("%s %s: %w", req.Method, req.URL.Path, err)
	}
	return result{status: resp.StatusCode, header: resp.Header, body: string(b)}, nil
}

// ledger is the part of GET /ledger the demo reads.
type ledger struct {
	Charges []struct {
		ID, Tenant, Account, Currency string
		Amount                        int64
	} `json:"charges"`
	Refunds []struct {
		ID        string `json:"id"`
		MessageID string `json:"message_id"`
		ChargeID  string `json:"charge_id"`
		Amount    int64  `json:"amount"`
	} `json:"refunds"`
	Queue queueStats `json:"refund_queue"`
}

type queueStats struct {
	Delivered, Processed, Duplicates, Failed int
}

func (a queueStats) minus(b queueStats) queueStats {
	return queueStats{a.Delivered - b.Delivered, a.Processed - b.Processed, a.Duplicates - b.Duplicates, a.Failed - b.Failed}
}

func (d *demo) ledger() (ledger, error) {
	req, err := http.NewRequestWithContext(context.Background(), "GET", d.base+"/ledger", nil)
	if err != nil {
		return ledger{}, err
	}
	r, err := d.do(req)
	if err != nil {
		return ledger{}, err
	}
	if r.status != http.StatusOK {
		return ledger{}, fmt.Errorf("GET /ledger: %d %s", r.status, compact(r.body))
	}
	var l ledger
	if err := json.Unmarshal([]byte(r.body), &l); err != nil {
		return ledger{}, fmt.Errorf("GET /ledger: %w", err)
	}
	return l, nil
}

// waitReady polls GET /ledger until the service answers.
func (d *demo) waitReady(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		_, err := d.ledger()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("service at %s not ready after %v: %w", d.base, timeout, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// compact returns a JSON body on one line.
func compact(body string) string {
	var b bytes.Buffer
	if json.Compact(&b, []byte(body)) != nil {
		return strings.TrimSpace(body)
	}
	return b.String()
}

func money(minor int64, currency string) string {
	return strings.TrimSpace(fmt.Sprintf("%d.%02d %s", minor/100, minor%100, currency))
}
