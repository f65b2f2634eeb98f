package observability_test

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/idemkit/idempotency/coordinator/idemevent"

	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/idemkit/idempotency/coordinator"
	"github.com/idemkit/idempotency/internal/breaker"
	"github.com/idemkit/idempotency/internal/redistest"
	"github.com/idemkit/idempotency/observability"
)

// refusalReasons are the reason label values of storage_refusals_total, as
// docs/observability.md lists them.
var refusalReasons = []string{"credentials", "permission", "database", "breaker_open"}

// refusals returns real refusals of a redis-server of the test's own, by
// reason, each wrapped as a store wraps it: error replies of Redis to wrong
// credentials, no credentials, a command the user may not run and an
// unknown database, and the error of an open circuit breaker.
func refusals(t *testing.T) map[string][]error {
	t.Helper()
	in := redistest.Start(t)
	if in.Kind() != redistest.KindRedisServer {
		t.Skip("needs redis-server: miniredis does not answer like Redis to AUTH, ACL and SELECT")
	}
	ctx := t.Context()
	admin := in.Client(t)
	wrap := func(err error) error {
		t.Helper()
		if err == nil {
			t.Fatal("the command succeeded, want an error reply")
		}
		var reply redis.Error
		if !errors.As(err, &reply) {
			t.Fatalf("%v (%T) is not an error reply", err, err)
		}
		return fmt.Errorf("idempotency: redis reserve: %w", err)
	}
	wrongPass := wrap(admin.Do(ctx, "AUTH", "nobody", "wrong-password").Err())
	if err := admin.Do(ctx, "ACL", "SETUSER", "limited", "on", ">limited-pw", "~*", "-@all", "+get").Err(); err != nil {
		t.Fatal(err)
	}
	opts := in.Options()
	opts.Username, opts.Password = "limited", "limited-pw"
	limited := redis.NewClient(opts)
	t.Cleanup(func() { _ = limited.Close() })
	noPerm := wrap(limited.Set(ctx, "k", "v", 0).Err())
	noDB := wrap(admin.Do(ctx, "SELECT", 100000).Err())
	if err := admin.ConfigSet(ctx, "requirepass", "admin-pw").Err(); err != nil {
		t.Fatal(err)
	}
	anon := redis.NewClient(in.Options())
	t.Cleanup(func() { _ = anon.Close() })
	noAuth := wrap(anon.Get(ctx, "k").Err())

	b, err := breaker.New(breaker.Config{Failures: 1, Cooldown: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	ticket, _ := b.Allow()
	b.Done(ticket, breaker.Failure, errors.New("dial tcp: connection refused"))
	_, open := b.Allow()
	if !errors.Is(open, breaker.ErrOpen) {
		t.Fatalf("Allow on an open breaker = %v, want breaker.ErrOpen", open)
	}
	return map[string][]error{
		"credentials":  {wrongPass, noAuth},
		"permission":   {noPerm},
		"database":     {noDB},
		"breaker_open": {fmt.Errorf("idempotency: redis reserve: %w", open)},
	}
}

// notRefusals are failed store calls that are not refusals: an error reply
// that is a bug or a full Redis, and an outage.
func notRefusals() []error {
	return []error{
		fmt.Errorf("idempotency: redis get: %w", redis.ErrClosed),
		errors.New("idempotency: redis reserve: dial tcp 127.0.0.1:6379: connect: connection refused"),
		// Texts of refusals that are not error replies: only Redis's own
		// answer counts.
		errors.New("WRONGPASS invalid username-password pair or user is disabled."),
		errors.New("NOPERM this user has no permissions to run the 'set' command"),
	}
}

func storageErrorEvent(t idemevent.ErrorType, err error) idemevent.Event {
	return idemevent.Event{Kind: idemevent.Error, Key: key("payment.charge"), ErrorType: t,
		Method: idemevent.MethodReserve, Err: &coordinator.StorageError{Method: idemevent.MethodReserve, Err: err}}
}

func TestStorageRefusalsAreCountedByReason(t *testing.T) {
	byReason := refusals(t)
	o, reg := newObserver(t, observability.WithOperations("payment.charge"))
	for _, r := range refusalReasons {
		if got := counter(t, reg, "idempotency_storage_refusals_total", "operation", "payment.charge", "reason", r); got != 0 {
			t.Fatalf("storage_refusals_total{%s} = %v before any event, want 0", r, got)
		}
	}
	storageTypes := []idemevent.ErrorType{idemevent.ErrorStorageGet, idemevent.ErrorStorageReserve,
		idemevent.ErrorStorageSave, idemevent.ErrorStorageRelease, idemevent.ErrorStorageRenew}
	want := map[string]float64{}
	for r, errs := range byReason {
		for _, err := range errs {
			for _, et := range storageTypes {
				feed(t, o, storageErrorEvent(et, err))
				want[r]++
			}
			// Not a store call's error type: not a refusal of the store.
			feed(t, o, storageErrorEvent(idemevent.ErrorDecode, err))
		}
	}
	for _, err := range notRefusals() {
		feed(t, o, storageErrorEvent(idemevent.ErrorStorageReserve, err))
	}
	// A storage call event carries the same error; only the error event counts.
	feed(t, o, idemevent.Event{Kind: idemevent.StorageCall, Key: key("payment.charge"),
		Method: idemevent.MethodReserve, Err: byReason["credentials"][0]})
	for _, r := range refusalReasons {
		if got := counter(t, reg, "idempotency_storage_refusals_total", "operation", "payment.charge", "reason", r); got != want[r] {
			t.Errorf("storage_refusals_total{%s} = %v, want %v", r, got, want[r])
		}
	}
	if n := seriesCount(t, reg, "idempotency_storage_refusals_total"); n != len(refusalReasons) {
		t.Errorf("storage_refusals_total has %d series, want %d", n, len(refusalReasons))
	}
	// errors_total keeps its meaning: every error event counts there, a
	// refusal or not.
	if got := counter(t, reg, "idempotency_errors_total", "operation", "payment.charge", "error_type", "storage_reserve_error"); got != 5+float64(len(notRefusals())) {
		t.Errorf("errors_total{storage_reserve_error} = %v, want %d", got, 5+len(notRefusals()))
	}
}

// The log line and the metric classify with the same rule: every refusal but
// the breaker's has its own message, and the rest are "storage call failed".
func TestStorageRefusalLogLines(t *testing.T) {
	byReason := refusals(t)
	msgs := map[string]string{
		"credentials":  "storage call failed: redis refused the credentials",
		"permission":   "storage call failed: redis denied the permission",
		"database":     "storage call failed: redis has no such database",
		"breaker_open": "storage call failed", // the breaker logged the outage when it opened
	}
	o, logs := logged(t)
	for r, errs := range byReason {
		for _, err := range errs {
			feed(t, o, storageErrorEvent(idemevent.ErrorStorageReserve, err))
			if e := only(t, logs); e.Message != msgs[r] || e.Level != zap.ErrorLevel {
				t.Errorf("%v: %s %q, want error %q", err, e.Level, e.Message, msgs[r])
			}
			feed(t, o, storageErrorEvent(idemevent.ErrorStorageRenew, err))
			if e := only(t, logs); e.Message != msgs[r] || e.Level != zap.WarnLevel {
				t.Errorf("%v (renew): %s %q, want warn %q", err, e.Level, e.Message, msgs[r])
			}
		}
	}
	for _, err := range notRefusals() {
		feed(t, o, storageErrorEvent(idemevent.ErrorStorageReserve, err))
		if e := only(t, logs); e.Message != "storage call failed" {
			t.Errorf("%v: %q, want %q", err, e.Message, "storage call failed")
		}
	}
}
