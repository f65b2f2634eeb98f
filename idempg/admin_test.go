package idempg_test

import (
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idempotency/coordinator/idemstore"

	"github.com/idemkit/idempotency/idempg"
)

// TestAdmin covers what idemctl calls: Inspect, Count, Forget and
// ForgetOperation, on rows of every state, an expired row among them.
func TestAdmin(t *testing.T) {
	db := newDB(t, 4)
	s := db.store(t)
	ctx := t.Context()
	key := func(op, k string) idemstore.Key { return idemstore.Key{Operation: op, Key: k} }
	pending, done, gone, expired := key("pay", "p"), key("pay", "c"), key("pay", "n"), key("pay", "x")
	other := key("ship", "s")
	if _, ok, err := s.Reserve(ctx, pending, idemstore.Write{State: idemstore.StatePending, Token: "t1", Fingerprint: "fp", TTL: time.Minute}); err != nil || !ok {
		t.Fatalf("Reserve: %v %v", ok, err)
	}
	for _, k := range []idemstore.Key{done, other} {
		if _, ok, err := s.Reserve(ctx, k, idemstore.Write{State: idemstore.StateCompleted, Token: "t2", Result: []byte("hello"), TTL: time.Hour}); err != nil || !ok {
			t.Fatalf("Reserve: %v %v", ok, err)
		}
	}
	if _, ok, err := s.Reserve(ctx, gone, idemstore.Write{State: idemstore.StateNotReplayable, Token: "t3", Result: []byte("too big"), TTL: time.Hour}); err != nil || !ok {
		t.Fatalf("Reserve: %v %v", ok, err)
	}
	if _, err := db.pool.Exec(ctx, `INSERT INTO idempotency_records (operation, key, state, token, expires_at)
		VALUES ('pay', 'x', 'completed', 'old', clock_timestamp() - interval '1 second'),
		       ('pay', 'u', 'weird', 'old', clock_timestamp() + interval '1 hour')`); err != nil {
		t.Fatal(err)
	}

	infos, err := s.Inspect(ctx, pending, done, gone, expired, key("pay", "u"), key("pay", "absent"))
	if err != nil {
		t.Fatalf("Inspect: %v", err)
	}
	want := []struct {
		state idemstore.State
		fp    string
		size  int
		ttl   time.Duration
	}{
		{idemstore.StatePending, "fp", 0, time.Minute},
		{idemstore.StateCompleted, "", 5, time.Hour},
		{idemstore.StateNotReplayable, "", 7, time.Hour},
		{idemstore.StateAbsent, "", 0, 0},
		{idemstore.StateUnreadable, "", 0, time.Hour},
		{idemstore.StateAbsent, "", 0, 0},
	}
	if len(infos) != len(want) {
		t.Fatalf("Inspect returned %d infos, want %d", len(infos), len(want))
	}
	for i, w := range want {
		in := infos[i]
		if in.State != w.state || in.Fingerprint != w.fp || in.ResultSize != w.size ||
			in.TTL > w.ttl || (w.ttl > 0 && in.TTL < w.ttl-time.Minute/2) || (w.ttl == 0) != in.CreatedAt.IsZero() {
			t.Errorf("info %d (%s) = %+v, want state %s, fingerprint %q, size %d, TTL about %v", i, in.Key, in, w.state, w.fp, w.size, w.ttl)
		}
	}

	counts, err := s.Count(ctx)
	if err != nil {
		t.Fatalf("Count: %v", err)
	}
	wantCounts := map[string]idempg.Counts{
		"pay":  {Pending: 1, Completed: 2, NotReplayable: 1, Unreadable: 1},
		"ship": {Completed: 1},
	}
	if len(counts) != len(wantCounts) || counts["pay"] != wantCounts["pay"] || counts["ship"] != wantCounts["ship"] {
		t.Errorf("Count() = %+v, want %+v", counts, wantCounts)
	}
	if n := counts["pay"].Total(); n != 4 {
		t.Errorf("pay's Total = %d, want 4", n)
	}
	if counts, err := s.Count(ctx, "ship", "none"); err != nil || len(counts) != 2 || counts["ship"].Total() != 1 || counts["none"].Total() != 0 {
		t.Errorf("Count(ship, none) = %+v, %v; want ship 1 and none 0", counts, err)
	}

	// Forget counts live rows only, and deletes the expired one too.
	if n, err := s.Forget(ctx, done, expired, key("pay", "absent")); err != nil || n != 1 {
		t.Errorf("Forget(done, expired, absent) = %d, %v; want 1", n, err)
	}
	var rows int
	if err := db.pool.QueryRow(ctx, `SELECT count(*) FROM idempotency_records WHERE key IN ('c', 'x')`).Scan(&rows); err != nil || rows != 0 {
		t.Errorf("rows of the forgotten keys = %d, %v; want 0", rows, err)
	}
	// ForgetOperation goes a batch at a time and leaves other operations.
	var live, deleted int
	for range 10 {
		l, d, err := s.ForgetOperation(ctx, "pay", 2)
		if err != nil {
			t.Fatalf("ForgetOperation: %v", err)
		}
		if d > 2 {
			t.Fatalf("ForgetOperation deleted %d rows, want at most 2", d)
		}
		live, deleted = live+l, deleted+d
		if d == 0 {
			break
		}
	}
	if live != 3 || deleted != 3 {
		t.Errorf("ForgetOperation forgot %d live of %d rows, want 3 of 3", live, deleted)
	}
	if counts, err := s.Count(ctx); err != nil || len(counts) != 1 || counts["ship"].Total() != 1 {
		t.Errorf("Count after forgetting pay = %+v, %v; want ship's record only", counts, err)
	}
}

func TestAdminRefusesInvalidInput(t *testing.T) {
	db := newDB(t, 2)
	s := db.store(t)
	ctx := t.Context()
	bad := idemstore.Key{Operation: "pay", Key: ""}
	if _, err := s.Inspect(ctx, bad); err == nil || !strings.Contains(err.Error(), "inspect") {
		t.Errorf("Inspect of an empty key = %v, want an error", err)
	}
	if _, err := s.Forget(ctx, bad); err == nil {
		t.Error("Forget of an empty key: no error")
	}
	if _, err := s.Count(ctx, ""); err == nil {
		t.Error("Count of an empty operation: no error")
	}
	if _, _, err := s.ForgetOperation(ctx, "pay", 0); err == nil {
		t.Error("ForgetOperation with limit 0: no error")
	}
	if _, _, err := s.ForgetOperation(ctx, "", 10); err == nil {
		t.Error("ForgetOperation of an empty operation: no error")
	}
}
