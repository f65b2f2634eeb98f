package faultstore_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/idemkit/idempotency/coordinator/idemevent"
	"github.com/idemkit/idempotency/coordinator/idemstore"

	"github.com/idemkit/idempotency/coordinator/faultstore"
)

// bulkCall makes one bulk call standing for method on s, over key and a
// second key, and returns its error.
func bulkCall(ctx context.Context, s *faultstore.Store, method idemevent.Method) error {
	keys := []idemstore.Key{key, {Operation: "op", Key: "other"}}
	var err error
	switch method {
	case idemevent.MethodReserveMany:
		w := idemstore.Write{State: idemstore.StatePending, Token: "tok2", TTL: time.Minute}
		_, _, err = s.ReserveMany(ctx, keys, []idemstore.Write{w, w}, false)
	case idemevent.MethodGet:
		_, err = s.GetMany(ctx, keys)
	case idemevent.MethodCompleteMany:
		c := idemstore.Completion{State: idemstore.StateCompleted, Result: []byte("r"), TTL: time.Hour}
		_, err = s.CompleteMany(ctx, keys, []string{"tok", "tok"}, []idemstore.Completion{c, c})
	case idemevent.MethodRelease:
		_, err = s.DeleteMany(ctx, keys)
	default:
		panic("unknown method " + method)
	}
	return err
}

// bulkMethods are the methods the bulk calls count under.
var bulkMethods = []idemevent.Method{idemevent.MethodReserveMany, idemevent.MethodGet, idemevent.MethodCompleteMany, idemevent.MethodRelease}

func TestBulkCallsTakeTheirMethodsFaults(t *testing.T) {
	for _, m := range bulkMethods {
		t.Run(string(m), func(t *testing.T) {
			s, inner := newStore(t)
			s.FailOnce(m, nil)
			if err := bulkCall(t.Context(), s, m); !errors.Is(err, faultstore.ErrInjected) {
				t.Fatalf("first bulk call: %v, want ErrInjected", err)
			}
			untouched(t, inner)
			var seen []idemstore.Key
			s.Before(m, func(_ context.Context, k idemstore.Key) error {
				seen = append(seen, k)
				return nil
			})
			if err := bulkCall(t.Context(), s, m); err != nil {
				t.Fatalf("second bulk call: %v", err)
			}
			if len(seen) != 2 || seen[0] != key {
				t.Errorf("the hook saw %v, want each of the 2 keys in order", seen)
			}
			if n := s.Calls(m); n != 2 {
				t.Errorf("Calls(%s) = %d after 2 bulk calls, want 2", m, n)
			}
		})
	}
}

func TestBulkHookFailsTheWholeCall(t *testing.T) {
	s, inner := newStore(t)
	boom := errors.New("second key")
	s.Before(idemevent.MethodCompleteMany, func(_ context.Context, k idemstore.Key) error {
		if k != key {
			return boom
		}
		return nil
	})
	if err := bulkCall(t.Context(), s, idemevent.MethodCompleteMany); !errors.Is(err, boom) {
		t.Fatalf("CompleteMany with a failing hook on its second key: %v, want the hook's error", err)
	}
	untouched(t, inner)
}

func TestBulkLostReply(t *testing.T) {
	s, inner := newStore(t)
	s.LoseReplies(idemevent.MethodCompleteMany, 1, nil)
	if err := bulkCall(t.Context(), s, idemevent.MethodCompleteMany); !errors.Is(err, faultstore.ErrInjected) {
		t.Fatalf("CompleteMany with its reply lost: %v, want ErrInjected", err)
	}
	if got := inner.Snapshot(key); got.State != idemstore.StateCompleted {
		t.Errorf("inner record after a lost CompleteMany reply: %v, want completed (the call reached the store)", got.State)
	}
}

// notBulk is a Store without bulk operations.
type notBulk struct{ idemstore.Store }

func TestBulkNeedsABulkInner(t *testing.T) {
	_, inner := newStore(t)
	s := faultstore.Wrap(notBulk{inner})
	for _, m := range bulkMethods {
		if err := bulkCall(t.Context(), s, m); err == nil {
			t.Errorf("bulk call of %s over a store without bulk operations: no error", m)
		}
	}
}
