package storetest

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idempotency/coordinator/idemstore"
)

// Harness is what the suite needs to test one store. TestStore asks for a
// fresh Harness in every subtest.
type Harness struct {
	// Store is the store under test. Required.
	Store idemstore.Store

	// Advance makes d pass on the clock that decides expiry in Store, e.g.
	// the Advance method of a memstore.FakeClock, or miniredis's
	// FastForward. nil means the suite sleeps for d: use that for a server
	// whose clock the test cannot move, such as a real Redis. The subtests of
	// one TestStore run one after another, but a clock shared with other
	// tests running in parallel (t.Parallel) would expire their records too.
	Advance func(d time.Duration)

	// Corrupt plants under key something that Store reports as
	// idemstore.StateUnreadable (corrupt bytes, a wrong type, an unknown
	// format version). Give it a time to live on a shared server: the suite
	// cannot delete it. Corrupt reports its own failures through t. nil skips
	// the subtests that need an unreadable record.
	Corrupt func(t *testing.T, key idemstore.Key)

	// Tick is the short lease or time to live of the expiry subtests, and the
	// unit of time they let pass: they wait two ticks for a record to expire,
	// and expect a record to be there while two ticks of its time to live
	// remain. Zero means 100ms, which suits a local server; raise it on a
	// slow one. It must be a whole number of milliseconds.
	Tick time.Duration

	// Fences says that Store hands out fences: it is an idemstore.Fencer,
	// and fences are on in its configuration. false skips the Fences
	// subtests.
	Fences bool

	// TTLUnknown says that Store does not report the remaining time to live:
	// Record.TTL is always 0. The suite then checks expiry, but not the
	// reported TTLs.
	TTLUnknown bool
}

// Durations of the subtests that do not wait for expiry: long enough that
// nothing expires during a test on a slow machine, short enough that what
// the suite leaves on a shared server goes away soon.
const (
	lease   = 30 * time.Second
	longTTL = 2 * time.Minute

	defaultTick = 100 * time.Millisecond

	// goroutines is the number of callers in the concurrency subtests.
	goroutines = 64
)

// TestStore runs the conformance suite: one subtest per rule of the
// idemstore.Store contract, grouped by method (Reserve, Replace, Get,
// Complete, Release, Renew), then Expiry, Results, NotReplayable, Keys,
// Fences (with Harness.Fences), Bulk (when the store is a
// idemstore.BulkStore) and Concurrency.
// newHarness is called once at the start of every subtest, on the subtest's
// t, so it can register cleanups there; it may return the same store each
// time, or a new one. The subtests run one after another.
func TestStore(t *testing.T, newHarness func(t *testing.T) Harness) {
	t.Helper()
	for _, g := range groups {
		t.Run(g.name, func(t *testing.T) {
			for _, c := range g.cases {
				t.Run(c.name, func(t *testing.T) {
					e := newEnv(t, newHarness(t))
					if c.corrupt && e.h.Corrupt == nil {
						t.Skip("Harness.Corrupt is nil: no way to plant an unreadable record")
					}
					c.fn(t, e)
				})
			}
		})
	}
}

type group struct {
	name  string
	cases []testCase
}

type testCase struct {
	name    string
	corrupt bool // needs Harness.Corrupt
	fn      func(t *testing.T, e *env)
}

var groups = []group{
	{"Reserve", []testCase{
		{"AbsentWritesPending", false, testReserveAbsentPending},
		{"AbsentWritesCompleted", false, testReserveAbsentCompleted},
		{"EmptyFingerprint", false, testReserveEmptyFingerprint},
		{"ExistingPendingIsReturned", false, testReserveExistingPending},
		{"ExistingPendingWhateverTheWritersLease", false, testReserveExistingPendingShorterLease},
		{"ExistingCompletedIsReturned", false, testReserveExistingCompleted},
		{"ExistingUnreadableIsReturned", true, testReserveExistingUnreadable},
		{"WriteCompletedIfAbsent", false, testReserveWriteCompletedIfAbsent},
	}},
	{"Replace", []testCase{
		{"CompletedWithMatchingToken", false, testReplaceCompleted},
		{"CompletedByCompletedWrite", false, testReplaceCompletedByCompleted},
		{"CompletedWithOtherTokenIsRefused", false, testReplaceCompletedMismatch},
		{"PendingIsNeverReplaced", false, testReplacePending},
		{"NeedsReplaceFlag", false, testReplaceNeedsFlag},
		{"Absent", false, testReplaceAbsent},
		{"Unreadable", true, testReplaceUnreadable},
	}},
	{"Get", []testCase{
		{"Absent", false, testGetAbsent},
		{"Unreadable", true, testGetUnreadable},
	}},
	{"Complete", []testCase{
		{"Owner", false, testCompleteOwner},
		{"NotOwner", false, testCompleteNotOwner},
		{"Absent", false, testCompleteAbsent},
		{"Completed", false, testCompleteCompleted},
		{"Unreadable", true, testCompleteUnreadable},
	}},
	{"Release", []testCase{
		{"Owner", false, testReleaseOwner},
		{"NotOwner", false, testReleaseNotOwner},
		{"Absent", false, testReleaseAbsent},
		{"Completed", false, testReleaseCompleted},
		{"Unreadable", true, testReleaseUnreadable},
	}},
	{"Renew", []testCase{
		{"Owner", false, testRenewOwner},
		{"OwnerOutlivesFirstLease", false, testRenewOutlivesLease},
		{"NotOwner", false, testRenewNotOwner},
		{"Absent", false, testRenewAbsent},
		{"Completed", false, testRenewCompleted},
		{"Unreadable", true, testRenewUnreadable},
	}},
	{"Expiry", []testCase{
		{"Pending", false, testExpiryPending},
		{"Completed", false, testExpiryCompleted},
		{"CompleteSetsTTL", false, testExpiryCompleteSetsTTL},
		{"ReplaceSetsTTL", false, testExpiryReplaceSetsTTL},
		{"ExpiredLeaseIsLost", false, testExpiryLeaseLost},
	}},
	{"Results", []testCase{
		{"Empty", false, testResultEmpty},
		{"Nil", false, testResultNil},
		{"AllByteValues", false, testResultBinary},
		{"OneMebibyte", false, testResultLarge},
		{"Copied", false, testResultCopied},
	}},
	{"NotReplayable", []testCase{
		{"CompleteKeepsIt", false, testNotReplayableComplete},
		{"WriteKeepsIt", false, testNotReplayableWrite},
		{"IsNotPending", false, testNotReplayableIsNotPending},
		{"Expires", false, testNotReplayableExpires},
	}},
	{"Keys", []testCase{
		{"VisibleASCII", false, testKeyVisibleASCII},
		{"MaxLength", false, testKeyMaxLength},
		{"Distinct", false, testKeyDistinct},
		{"FingerprintMaxLength", false, testFingerprintMaxLength},
	}},
	{"Fences", []testCase{
		{"GrowAcrossReleaseExpiryTakeover", false, testFenceGrows},
		{"OwnRecordKeepsItsFence", false, testFenceOfOwnRecord},
		{"ConcurrentDistinct", false, testConcurrentFences},
	}},
	{"Bulk", []testCase{
		{"GetManyMixed", false, testGetManyMixed},
		{"GetManyEmpty", false, testGetManyEmpty},
		{"ReserveManyMixed", false, testReserveManyMixed},
		{"ReserveManyAllOrNothing", false, testReserveManyAllOrNothing},
		{"ReserveManyReplace", false, testReserveManyReplace},
		{"ReserveManySameKeyTwice", false, testReserveManySameKeyTwice},
		{"MismatchedLengths", false, testBulkMismatchedLengths},
		{"CompleteManyOwners", false, testCompleteManyOwners},
		{"DeleteMany", false, testDeleteMany},
		{"ManyKeys", false, testBulkManyKeys},
		{"ConcurrentReserveMany", false, testConcurrentReserveMany},
		{"Expiry", false, testExpiryReserveMany},
	}},
	{"Concurrency", []testCase{
		{"ReserveOneWinner", false, testConcurrentReserve},
		{"ReplaceCompletedOneWinner", false, testConcurrentReplace},
		{"ReplaceUnreadableOneWinner", true, testConcurrentReplaceUnreadable},
		{"CompleteOrReleaseOneWinner", false, testConcurrentCompleteRelease},
	}},
}

// env is one subtest's harness and helpers. Its helpers fail the test on a
// store error: the suite never expects one.
type env struct {
	t    *testing.T
	h    Harness
	tick time.Duration
}

func newEnv(t *testing.T, h Harness) *env {
	t.Helper()
	if h.Store == nil {
		t.Fatal("storetest: Harness.Store is nil")
	}
	tick := h.Tick
	if tick == 0 {
		tick = defaultTick
	}
	if tick < 0 || tick%time.Millisecond != 0 {
		t.Fatalf("storetest: Harness.Tick %v is not a positive whole number of milliseconds", h.Tick)
	}
	return &env{t: t, h: h, tick: tick}
}

// pass lets d pass on the store's clock.
func (e *env) pass(d time.Duration) {
	e.t.Helper()
	if e.h.Advance != nil {
		e.h.Advance(d)
		return
	}
	select {
	case <-time.After(d):
	case <-e.t.Context().Done():
		e.t.Fatalf("context done while waiting %v: %v", d, e.t.Context().Err())
	}
}

// key returns a key of the store nobody else uses.
func (e *env) key(name string) idemstore.Key {
	return idemstore.Key{Operation: "storetest", Key: name + "." + rand.Text()}
}

// token returns a fresh owner token, in the coordinator's form.
func token() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b) // never returns an error
	return hex.EncodeToString(b)
}

func (e *env) reserve(key idemstore.Key, w idemstore.Write) (idemstore.Record, bool) {
	e.t.Helper()
	rec, ok, err := e.h.Store.Reserve(e.t.Context(), key, w)
	if err != nil {
		e.t.Fatalf("Reserve(%s): %v", key, err)
	}
	if ok && !isZero(rec) {
		e.t.Errorf("Reserve(%s) wrote and returned %s, want the zero Record", key, show(rec))
	}
	return rec, ok
}

// mustReserve reserves an absent key and fails the test if it does not.
func (e *env) mustReserve(key idemstore.Key, w idemstore.Write) {
	e.t.Helper()
	if rec, ok := e.reserve(key, w); !ok {
		e.t.Fatalf("Reserve(%s) on an absent key: written = false, existing %s", key, show(rec))
	}
}

func (e *env) get(key idemstore.Key) idemstore.Record {
	e.t.Helper()
	rec, err := e.h.Store.Get(e.t.Context(), key)
	if err != nil {
		e.t.Fatalf("Get(%s): %v", key, err)
	}
	return rec
}

func (e *env) complete(key idemstore.Key, tok string, result []byte, ttl time.Duration) bool {
	e.t.Helper()
	ok, err := e.h.Store.Complete(e.t.Context(), key, tok, idemstore.Completion{State: idemstore.StateCompleted, Result: result, TTL: ttl})
	if err != nil {
		e.t.Fatalf("Complete(%s): %v", key, err)
	}
	return ok
}

func (e *env) release(key idemstore.Key, tok string) bool {
	e.t.Helper()
	ok, err := e.h.Store.Release(e.t.Context(), key, tok)
	if err != nil {
		e.t.Fatalf("Release(%s): %v", key, err)
	}
	return ok
}

func (e *env) renew(key idemstore.Key, tok string, d time.Duration) bool {
	e.t.Helper()
	ok, err := e.h.Store.Renew(e.t.Context(), key, tok, d)
	if err != nil {
		e.t.Fatalf("Renew(%s): %v", key, err)
	}
	return ok
}

// corrupt plants an unreadable record under key and returns it as Get
// reports it.
func (e *env) corrupt(key idemstore.Key) idemstore.Record {
	e.t.Helper()
	e.h.Corrupt(e.t, key)
	rec := e.get(key)
	if rec.State != idemstore.StateUnreadable {
		e.t.Fatalf("Get(%s) after Harness.Corrupt: %s, want state unreadable", key, show(rec))
	}
	return rec
}

// check compares got, a record the store reported, with want. State, Token,
// Fingerprint and Result must be equal (a nil and an empty Result are
// equal). When want.TTL is positive, got.TTL must lie in (above, want.TTL];
// when it is 0, got.TTL is not checked. An absent record must be the zero
// Record.
func (e *env) check(what string, got, want idemstore.Record, above time.Duration) {
	e.t.Helper()
	if want.State == idemstore.StateAbsent {
		if !isZero(got) {
			e.t.Errorf("%s: got %s, want the zero Record (absent)", what, show(got))
		}
		return
	}
	if got.State != want.State {
		e.t.Errorf("%s: state %s, want %s (record %s)", what, got.State, want.State, show(got))
		return
	}
	if got.Token != want.Token {
		e.t.Errorf("%s: token %q, want %q", what, got.Token, want.Token)
	}
	if got.Fingerprint != want.Fingerprint {
		e.t.Errorf("%s: fingerprint %q, want %q", what, got.Fingerprint, want.Fingerprint)
	}
	if !bytes.Equal(got.Result, want.Result) {
		e.t.Errorf("%s: result %s, want %s", what, showBytes(got.Result), showBytes(want.Result))
	}
	if want.TTL > 0 && !e.h.TTLUnknown && (got.TTL <= above || got.TTL > want.TTL) {
		e.t.Errorf("%s: TTL %v, want more than %v and at most %v", what, got.TTL, above, want.TTL)
	}
}

func isZero(r idemstore.Record) bool {
	return r.State == idemstore.StateAbsent && r.Token == "" && r.Fingerprint == "" && r.Result == nil && r.TTL == 0
}

func show(r idemstore.Record) string {
	return fmt.Sprintf("{%s token=%q fingerprint=%q result=%s ttl=%v}", r.State, r.Token, r.Fingerprint, showBytes(r.Result), r.TTL)
}

func showBytes(b []byte) string {
	const limit = 48
	if b == nil {
		return "nil"
	}
	if len(b) > limit {
		return fmt.Sprintf("%q... (%d bytes)", b[:limit], len(b))
	}
	return fmt.Sprintf("%q", b)
}

func pending(tok, fp string, ttl time.Duration) idemstore.Write {
	return idemstore.Write{State: idemstore.StatePending, Token: tok, Fingerprint: fp, TTL: ttl}
}

func completed(tok, fp string, result []byte, ttl time.Duration) idemstore.Write {
	return idemstore.Write{State: idemstore.StateCompleted, Token: tok, Fingerprint: fp, Result: result, TTL: ttl}
}

// replace returns w as a compare-and-swap of the record with token old.
func replace(w idemstore.Write, old string) idemstore.Write {
	w.Replace = true
	w.ReplaceToken = old
	return w
}

// record returns the record a store should report after writing w.
func record(w idemstore.Write) idemstore.Record {
	r := idemstore.Record{State: w.State, Token: w.Token, Fingerprint: w.Fingerprint, TTL: w.TTL}
	if w.State == idemstore.StateCompleted || w.State == idemstore.StateNotReplayable {
		r.Result = w.Result
	}
	return r
}

// runAll runs fn(i) for i in [0, n) on n goroutines released at once, and
// waits for them all.
func runAll(n int, fn func(i int)) {
	start := make(chan struct{})
	done := make(chan struct{})
	for i := range n {
		go func() {
			defer func() { done <- struct{}{} }()
			<-start
			fn(i)
		}()
	}
	close(start)
	for range n {
		<-done
	}
}

// ctx returns the subtest's context, for calls made off the test goroutine
// (where the helpers, which call t.Fatalf, must not be used).
func (e *env) ctx() context.Context { return e.t.Context() }

// pad returns s extended to n bytes by repeating fill.
func pad(s string, n int, fill string) string {
	if len(s) >= n {
		return s[:n]
	}
	return s + strings.Repeat(fill, (n-len(s))/len(fill)+1)[:n-len(s)]
}
