package redisrepo_test

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idempotency/coordinator/idemstore"

	"github.com/redis/go-redis/v9"
)

// TestInspectReadsAsGet: Inspect and Get read a record with the one reader of
// the prelude (record.lua's load) and Go's decodeValue agree on every value
// under a key:
// the state, the fingerprint, and the size of the result that Get returns.
func TestInspectReadsAsGet(t *testing.T) {
	eachBackend(t, func(t *testing.T, c redis.UniversalClient) {
		ctx := context.Background()
		s := newStore(t, c)
		kinds := append([]unreadable{
			{name: "pending", plant: hset("v", "1", "state", "pending", "token", "t", "fp", "fp-p", "created_ms", "1760000000000")},
			{name: "pending with a stray result", plant: hset("v", "1", "state", "pending", "token", "t", "fp", "", "result", "r")},
			{name: "completed", plant: hset("v", "1", "state", "completed", "token", "t", "fp", "fp-c", "result", "0123456789", "created_ms", "1760000000000")},
			{name: "completed with an empty result", plant: hset("v", "1", "state", "completed", "token", "t", "fp", "", "result", "")},
			{name: "format 2 pending", plant: set("\x02\x01\x04\x01\x00\x02t\x0a\xff")},
			{name: "format 2 pending, waited on, packed token", plant: set("\x02\x01\x03\x01\x00\x02\xabfp")},
			{name: "format 2 completed", plant: set("\x02\x02\x04\x01\x00\x02t\x0a\xffresult")},
			{name: "format 2 completed, empty result", plant: set("\x02\x02\x00\x01\x00\x00t")},
			{name: "completed of other fields too", plant: hset("v", "1", "state", "completed", "token", "t", "fp", "f", "result", "\x00\xff", "x", "y")},
		}, unreadables...)
		for _, u := range kinds {
			key := newKey("inspect-as-get")
			plant(t, c, s.Key(key), u)
			rec := mustGet(t, s, key)
			infos, err := s.Inspect(ctx, key)
			if err != nil || len(infos) != 1 {
				t.Fatalf("%s: Inspect = %+v, %v", u.name, infos, err)
			}
			in := infos[0]
			if in.State != rec.State || in.Fingerprint != rec.Fingerprint || in.ResultSize != len(rec.Result) {
				t.Errorf("%s: Inspect = %+v, Get = %+v: they disagree", u.name, in, rec)
			}
			if in.TTL < time.Minute || in.TTL > 2*time.Minute {
				t.Errorf("%s: Inspect TTL %v, want about 2m", u.name, in.TTL)
			}
			readable := rec.State == idemstore.StatePending || rec.State == idemstore.StateCompleted
			created, _ := c.HGet(ctx, s.Key(key), "created_ms").Result() // "" for none, or not a hash
			if !in.CreatedAt.IsZero() != (readable && created != "") {
				t.Errorf("%s: CreatedAt %v of a record in state %s with created_ms %q", u.name, in.CreatedAt, rec.State, created)
			}
		}
	})
}

// TestInspectUsesPrelude: inspect.lua leaves the record format to the
// prelude. It names none of the format's fields, states, types or versions,
// and calls no command that reads a hash, so that a change of the format is
// made in record.lua alone.
func TestInspectUsesPrelude(t *testing.T) {
	src, err := os.ReadFile("inspect.lua")
	if err != nil {
		t.Fatal(err)
	}
	var code []string // inspect.lua without its comments
	for line := range strings.SplitSeq(string(src), "\n") {
		code = append(code, strings.SplitN(line, "--", 2)[0])
	}
	body := strings.Join(code, "\n")
	for _, s := range []string{
		"'v'", "'state'", "'token'", "'fp'", "'result'", "'created_ms'",
		"'pending'", "'completed'", "'hash'", "'none'", "VERSION",
		"HMGET", "HGET", "HEXISTS", "HSTRLEN", "TYPE", "keytype",
	} {
		if strings.Contains(body, s) {
			t.Errorf("inspect.lua reads the record format itself (%s): leave it to record.lua", s)
		}
	}
	if !strings.Contains(body, "load(") {
		t.Error("inspect.lua does not read its records with record.lua's load")
	}
}
