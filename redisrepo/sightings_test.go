package redisrepo_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idempotency/coordinator/idemstore"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idempotency/internal/redistest"
	"github.com/idemkit/idempotency/redisrepo"
)

// failingScripts is a Client whose EVALSHA and EVAL calls fail, hang until
// their context ends, or take a while, as a Redis might whose scripts are
// slow or broken while its plain commands answer.
type failingScripts struct {
	redisrepo.Client
	fault string // "fail", "hang" or "slow"
}

func (f *failingScripts) Process(ctx context.Context, cmd redis.Cmder) error {
	if name := strings.ToLower(cmd.Name()); name == "evalsha" || name == "eval" {
		switch f.fault {
		case "fail":
			cmd.SetErr(errors.New("ERR injected script failure"))
			return cmd.Err()
		case "hang":
			<-ctx.Done()
			cmd.SetErr(ctx.Err())
			return cmd.Err()
		case "slow":
			time.Sleep(50 * time.Millisecond)
		}
	}
	return f.Client.Process(ctx, cmd)
}

// TestWedgedCheckFaults: the check of a pending record that Reserve keeps
// meeting (abandon.lua) is opportunistic. When it fails or hangs while
// the rest of Redis answers, Reserve still answers with the pending record
// it met, within its context's deadline, and no error: a refused duplicate
// stays a refusal, never a storage error that would make mode run run the
// action unprotected. When it is slow, it still heals a wedged record.
func TestWedgedCheckFaults(t *testing.T) {
	client := redistest.Server(t)
	prefix := redistest.Prefix(t)
	plain := redisrepo.New(client, redisrepo.WithKeyPrefix(prefix))
	for _, fault := range []string{"fail", "hang", "slow"} {
		t.Run(fault, func(t *testing.T) {
			s := redisrepo.New(&failingScripts{Client: client, fault: fault}, redisrepo.WithKeyPrefix(prefix))
			clock := newFakeClock(s)
			for _, wedged := range []bool{false, true} {
				key := newKey("check-" + fault)
				holder := pendingWrite(token(), "", time.Minute)
				mustReserve(t, plain, key, holder)
				if wedged {
					if err := client.Persist(t.Context(), plain.Key(key)).Err(); err != nil {
						t.Fatal(err)
					}
				}
				meet := func() (idemstore.Record, bool, error) {
					ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
					defer cancel()
					return s.Reserve(ctx, key, pendingWrite(token(), "", time.Second))
				}
				if rec, ok, err := meet(); err != nil || ok || rec.Token != holder.Token {
					t.Fatalf("first meeting: %+v, %v, %v; want the holder's record", rec, ok, err)
				}
				clock.advance(time.Second)
				start := time.Now()
				rec, ok, err := meet()
				if d := time.Since(start); d > time.Second {
					t.Errorf("the check took %v, past the call's deadline", d)
				}
				switch {
				case err != nil:
					t.Errorf("wedged=%v: the check's fault %q surfaced as %v; want the record met", wedged, fault, err)
				case fault == "slow" && wedged && !ok:
					t.Errorf("slow check of a wedged record: %+v, not written; want it taken over", rec)
				case !(fault == "slow" && wedged) && (ok || rec.Token != holder.Token):
					t.Errorf("wedged=%v, fault %q: %+v, written %v; want the holder's record", wedged, fault, rec, ok)
				}
			}
		})
	}
}
