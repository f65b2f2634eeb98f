package storetest

import (
	"crypto/rand"
	"fmt"
	"strings"
	"testing"

	"github.com/idemkit/idempotency/coordinator/idemstore"

	"github.com/idemkit/idempotency/coordinator"
)

// The subtests of what a store must carry unchanged: result bytes, keys and
// fingerprints.

// roundTrip stores result both ways (Complete after Reserve, and a
// completed Write) and checks that Get returns it.
func roundTrip(t *testing.T, e *env, name string, result []byte) {
	t.Helper()
	key := e.key(name + "-complete")
	w := pending(token(), "fp-1", lease)
	e.mustReserve(key, w)
	if !e.complete(key, w.Token, result, longTTL) {
		t.Fatalf("Complete(%s) by the owner: false, want true", key)
	}
	want := idemstore.Record{State: idemstore.StateCompleted, Token: w.Token, Fingerprint: w.Fingerprint, Result: result, TTL: longTTL}
	e.check("Get after Complete", e.get(key), want, 0)

	key = e.key(name + "-write")
	cw := completed(token(), "fp-1", result, longTTL)
	e.mustReserve(key, cw)
	e.check("Get after a completed write", e.get(key), record(cw), 0)
	existing, ok := e.reserve(key, pending(token(), "fp-1", lease))
	if ok {
		t.Fatalf("Reserve(%s) over a completed record: written = true, want false", key)
	}
	e.check("record returned by Reserve", existing, record(cw), 0)
}

// The empty result is a result: the record is completed, with no bytes.
// Whether the store gives them back as nil or as []byte{} is its choice.
func testResultEmpty(t *testing.T, e *env) { roundTrip(t, e, "result-empty", []byte{}) }
func testResultNil(t *testing.T, e *env)   { roundTrip(t, e, "result-nil", nil) }

func testResultBinary(t *testing.T, e *env) {
	result := make([]byte, 0, 512)
	for i := range 256 {
		result = append(result, byte(i))
	}
	for i := range 256 { // and backwards, so every byte follows every other kind
		result = append(result, byte(255-i))
	}
	roundTrip(t, e, "result-binary", result)
}

func testResultLarge(t *testing.T, e *env) {
	result := make([]byte, 1<<20) // coordinator.DefaultMaxResultBytes
	_, _ = rand.Read(result)
	roundTrip(t, e, "result-large", result)
}

func testResultCopied(t *testing.T, e *env) {
	key := e.key("result-copied")
	w := pending(token(), "fp-1", lease)
	e.mustReserve(key, w)
	result := []byte("original")
	if !e.complete(key, w.Token, result, longTTL) {
		t.Fatalf("Complete(%s) by the owner: false, want true", key)
	}
	copy(result, "CHANGED!") // the caller reuses its buffer
	want := idemstore.Record{State: idemstore.StateCompleted, Token: w.Token, Fingerprint: w.Fingerprint, Result: []byte("original"), TTL: longTTL}
	got := e.get(key)
	e.check("Get after the caller changed the slice it passed to Complete", got, want, 0)
	copy(got.Result, "CHANGED!") // a reader changes what it got
	e.check("Get after a reader changed the slice Get returned", e.get(key), want, 0)

	key = e.key("result-copied-write")
	buf := []byte("original")
	cw := completed(token(), "fp-1", buf, longTTL)
	e.mustReserve(key, cw)
	copy(buf, "CHANGED!")
	cw.Result = []byte("original")
	e.check("Get after the caller changed the slice it passed to Reserve", e.get(key), record(cw), 0)
}

// lifecycle runs a key through reserve, a refused second reserve, renew,
// complete and a replay, and a second key through reserve and release.
func lifecycle(t *testing.T, e *env, key, other idemstore.Key) {
	t.Helper()
	validKeys(t, key, other)
	w := pending(token(), "fp-1", lease)
	e.mustReserve(key, w)
	if existing, ok := e.reserve(key, pending(token(), "fp-1", lease)); ok {
		t.Fatalf("second Reserve(%q): written = true, want false", key)
	} else {
		e.check("record returned by the second Reserve", existing, record(w), 0)
	}
	if !e.renew(key, w.Token, lease) {
		t.Fatalf("Renew(%q) by the owner: false, want true", key)
	}
	if !e.complete(key, w.Token, []byte("result"), longTTL) {
		t.Fatalf("Complete(%q) by the owner: false, want true", key)
	}
	want := idemstore.Record{State: idemstore.StateCompleted, Token: w.Token, Fingerprint: w.Fingerprint, Result: []byte("result"), TTL: longTTL}
	e.check(fmt.Sprintf("Get(%q) after Complete", key), e.get(key), want, 0)

	o := pending(token(), "fp-2", lease)
	e.mustReserve(other, o)
	if !e.release(other, o.Token) {
		t.Fatalf("Release(%q) by the owner: false, want true", other)
	}
	e.check(fmt.Sprintf("Get(%q) after Release", other), e.get(other), idemstore.Record{}, 0)
	e.check(fmt.Sprintf("Get(%q) after another key was released", key), e.get(key), want, 0)
}

// validKeys fails the test if a key it made is one the coordinator would
// refuse: the suite only tests what a Store can be given.
func validKeys(t *testing.T, keys ...idemstore.Key) {
	t.Helper()
	for _, k := range keys {
		if err := coordinator.ValidateOperation(k.Operation); err != nil {
			t.Fatalf("storetest bug: %v", err)
		}
		if err := coordinator.ValidateKey(k.Key); err != nil {
			t.Fatalf("storetest bug: %v", err)
		}
	}
}

// visible is every visible ASCII byte, 0x21 to 0x7E: the alphabet of keys.
func visible() string {
	var b strings.Builder
	for c := byte(0x21); c <= 0x7e; c++ {
		b.WriteByte(c)
	}
	return b.String()
}

func testKeyVisibleASCII(t *testing.T, e *env) {
	// Quotes, backslashes, braces (Redis Cluster hash tags), colons (the
	// separator of operation and key), percent signs, asterisks...
	suffix := rand.Text()
	key := idemstore.Key{Operation: "storetest", Key: visible() + suffix}
	other := idemstore.Key{Operation: "storetest", Key: `{}:"\'` + suffix}
	lifecycle(t, e, key, other)
}

func testKeyMaxLength(t *testing.T, e *env) {
	suffix := rand.Text()
	op := pad("storetest."+suffix, coordinator.MaxOperationLen, "._-x")
	key := idemstore.Key{Operation: op, Key: pad(suffix+visible(), coordinator.MaxKeyLen, `{}:"\'`)}
	other := idemstore.Key{Operation: op, Key: pad(suffix+"other", coordinator.MaxKeyLen, "z")}
	if len(key.Operation) != coordinator.MaxOperationLen || len(key.Key) != coordinator.MaxKeyLen {
		t.Fatalf("test bug: operation of %d bytes, key of %d", len(key.Operation), len(key.Key))
	}
	lifecycle(t, e, key, other)
}

func testKeyDistinct(t *testing.T, e *env) {
	// Keys that a careless encoding would confuse: the same key under two
	// operations, keys that differ in case only, a key and its prefix, and
	// splits of one string into operation and key that a store joining them
	// without the ":" separator would confuse.
	base := "k" + rand.Text()
	keys := []idemstore.Key{
		{Operation: "storetest.a", Key: base},
		{Operation: "storetest.b", Key: base},
		{Operation: "storetest.a", Key: strings.ToLower(base)},
		{Operation: "storetest.a", Key: base + "x"},
		{Operation: "storetest.a", Key: base + ":x"},
		{Operation: "storetest.a", Key: "x:" + base},
		{Operation: "storetest.ax", Key: base},
		{Operation: "storetest.a", Key: "x" + base},
	}
	validKeys(t, keys...)
	writes := make([]idemstore.Write, len(keys))
	for i, k := range keys {
		writes[i] = pending(token(), fmt.Sprintf("fp-%d", i), lease)
		if existing, ok := e.reserve(k, writes[i]); !ok {
			t.Fatalf("Reserve(%+v): written = false, existing %s; want a key of its own", k, show(existing))
		}
	}
	for i, k := range keys {
		e.check(fmt.Sprintf("Get(%+v)", k), e.get(k), record(writes[i]), 0)
	}
}

func testFingerprintMaxLength(t *testing.T, e *env) {
	key := e.key("fingerprint-max")
	fp := pad(visible(), coordinator.MaxFingerprintLen, `{}:"\'`)
	w := pending(token(), fp, lease)
	e.mustReserve(key, w)
	e.check("Get after Reserve", e.get(key), record(w), 0)
	if !e.complete(key, w.Token, []byte("result"), longTTL) {
		t.Fatalf("Complete(%s) by the owner: false, want true", key)
	}
	want := idemstore.Record{State: idemstore.StateCompleted, Token: w.Token, Fingerprint: fp, Result: []byte("result"), TTL: longTTL}
	e.check("Get after Complete", e.get(key), want, 0)
}
