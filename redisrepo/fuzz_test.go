package redisrepo_test

import (
	"context"
	"testing"
	"time"

	"github.com/idemkit/idempotency/coordinator/idemstore"

	"github.com/idemkit/idempotency/internal/redistest"
	"github.com/idemkit/idempotency/redisrepo"
)

// The fields of a record, and the bits of FuzzRecordDecoding's mask that
// say which of them it plants.
const (
	fieldV = 1 << iota
	fieldState
	fieldToken
	fieldFP
	fieldResult
	fieldCreated
	fieldExtra
)

// FuzzRecordDecoding plants HASHes of arbitrary fields and values under a
// key and checks what Get, Reserve and Inspect make of them: never an error
// or a panic; a pending or completed record exactly when the hash is a
// record of format version 1, with the planted values; unreadable otherwise.
func FuzzRecordDecoding(f *testing.F) {
	all := uint8(fieldV | fieldState | fieldToken | fieldFP | fieldResult | fieldCreated)
	f.Add(all, "1", "completed", "tok", "fp", "result", "1760000000000", "")
	f.Add(all&^fieldResult, "1", "pending", "tok", "", "", "1760000000000", "")
	f.Add(all|fieldExtra, "1", "pending", "", "", "", "", "x")
	f.Add(all, "2", "completed", "tok", "fp", "result", "1", "")
	f.Add(all, "1", "Completed", "tok", "fp", "result", "1", "")
	f.Add(all, "1.0", "pending", "tok", "fp", "", "nan", "")
	f.Add(all&^fieldToken, "1", "pending", "", "fp", "", "1", "")
	f.Add(all&^fieldFP, "1", "pending", "tok", "", "", "1", "")
	f.Add(all&^fieldResult, "1", "completed", "tok", "fp", "", "1", "")
	f.Add(uint8(fieldExtra), "", "", "", "", "", "", "\x00\xff")
	f.Add(all, "1", "pending", "\x00", "\xff\xfe", "\r\n$-1\r\n", "-1", "")

	c := redistest.Server(f)
	s := redisrepo.New(c, redisrepo.WithKeyPrefix(redistest.Prefix(f)))
	f.Fuzz(func(t *testing.T, mask uint8, v, state, tok, fp, result, created, extra string) {
		ctx := context.Background()
		key := idemstore.Key{Operation: "fuzz", Key: "k"}
		name := s.Key(key)
		c.Del(ctx, name)
		defer c.Del(ctx, name)

		var kv []any
		for _, fv := range []struct {
			bit   uint8
			field string
			value string
		}{
			{fieldV, "v", v}, {fieldState, "state", state}, {fieldToken, "token", tok}, {fieldFP, "fp", fp},
			{fieldResult, "result", result}, {fieldCreated, "created_ms", created}, {fieldExtra, "extra", extra},
		} {
			if mask&fv.bit != 0 {
				kv = append(kv, fv.field, fv.value)
			}
		}
		want := idemstore.StateAbsent
		if len(kv) > 0 {
			if err := c.HSet(ctx, name, kv...).Err(); err != nil {
				t.Fatalf("HSET: %v", err)
			}
			c.PExpire(ctx, name, time.Minute)
			want = idemstore.StateUnreadable
			if has := func(bits uint8) bool { return mask&bits == bits }; v == "1" && has(fieldV|fieldState|fieldToken|fieldFP) {
				switch {
				case state == "pending":
					want = idemstore.StatePending
				case state == "completed" && has(fieldResult):
					want = idemstore.StateCompleted
				}
			}
		}

		rec, err := s.Get(ctx, key)
		if err != nil {
			t.Fatalf("Get: %v", err)
		}
		if rec.State != want {
			t.Fatalf("Get: state %s, want %s (record %+v)", rec.State, want, rec)
		}
		switch want {
		case idemstore.StatePending, idemstore.StateCompleted:
			if rec.Token != tok || rec.Fingerprint != fp {
				t.Errorf("Get = %+v, want token %q, fingerprint %q", rec, tok, fp)
			}
			if want == idemstore.StateCompleted && string(rec.Result) != result {
				t.Errorf("Get: result %q, want %q", rec.Result, result)
			}
			if want == idemstore.StatePending && rec.Result != nil {
				t.Errorf("Get: pending record with result %q", rec.Result)
			}
		case idemstore.StateUnreadable:
			if rec.Token != "" || rec.Fingerprint != "" || rec.Result != nil {
				t.Errorf("Get = %+v, want an unreadable record with nothing in it", rec)
			}
		}
		if want != idemstore.StateAbsent && rec.TTL <= 0 {
			t.Errorf("Get: TTL %v, want positive", rec.TTL)
		}

		infos, err := s.Inspect(ctx, key)
		if err != nil || len(infos) != 1 || infos[0].State != want {
			t.Errorf("Inspect = %+v, %v; want state %s", infos, err, want)
		}

		existing, written, err := s.Reserve(ctx, key, pendingWrite("mine", "", time.Minute))
		if err != nil {
			t.Fatalf("Reserve: %v", err)
		}
		if written != (want == idemstore.StateAbsent) || (!written && existing.State != want) {
			t.Errorf("Reserve = %+v, %v; want written only over an absent key", existing, written)
		}
	})
}
