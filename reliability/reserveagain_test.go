//go:build linux

package reliability_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idempotency/coordinator/idemstore"
	"github.com/idemkit/idempotency/redisrepo"
)

// reserveAgain is the store of a batched storm whose single-key Reserve can
// be faulted while every other command answers: ReserveMany, the
// completions, renewals, reads and watches. In a batch (DoBatch) that call
// is the second reservation of an entry: at its turn when its lease was
// lost while it waited, or when another caller held its key at the batch's
// read and actions of the batch have run since; and the rounds after a
// wait. It embeds the Redis store, so the coordinator finds its bulk
// operations, fences and watches.
type reserveAgain struct {
	*redisrepo.Store
	mode atomic.Int32 // a reserveFault
	met  atomic.Int64 // single Reserves the fault met
}

// reserveFault is what reserveAgain's single-key Reserve does.
type reserveFault int32

const (
	reserveAnswers reserveFault = iota
	// reserveFails returns a connection error without sending the command.
	reserveFails
	// reserveHangs sends the command, so that the reservation may be
	// written, and then gives no answer until the call's context ends: a
	// reply lost on the way back.
	reserveHangs
	// reserveSlow answers reserveSlowBy late, within the storage timeout.
	reserveSlow
)

// How many single Reserves a reserveAgain fault waits to meet, and for how
// long at most.
const (
	reserveAgainMet = 3
	reserveAgainMax = 20 * loopFor
)

// reserveSlowBy is reserveSlow's delay: most of the storage timeout
// (100ms), so that the Reserve answers, late, while the batch's other
// entries wait on it.
const reserveSlowBy = 70 * time.Millisecond

var errReserveRefused = errors.New("dial tcp: connect: connection refused (injected into the single-key Reserve)")

func wrapReserveAgain(s *redisrepo.Store) idemstore.Store { return &reserveAgain{Store: s} }

func (r *reserveAgain) Reserve(ctx context.Context, key idemstore.Key, w idemstore.Write) (idemstore.Record, bool, error) {
	switch reserveFault(r.mode.Load()) {
	case reserveFails:
		r.met.Add(1)
		return idemstore.Record{}, false, errReserveRefused
	case reserveHangs:
		r.met.Add(1)
		_, _, _ = r.Store.Reserve(ctx, key, w)
		<-ctx.Done()
		return idemstore.Record{}, false, ctx.Err()
	case reserveSlow:
		r.met.Add(1)
		select {
		case <-time.After(reserveSlowBy):
		case <-ctx.Done():
			return idemstore.Record{}, false, ctx.Err()
		}
	}
	return r.Store.Reserve(ctx, key, w)
}

// reserveAgainFault is the fault that sets reserveAgain's mode to m for
// loopFor, and on until reserveAgainMet single Reserves have met it, for
// at most reserveAgainMax: a storm reaches the step 0 to 15 times a second
// (it takes a collision with a pending record and an action before it in
// the batch, and most entries are replays), fewer on a loaded machine. It needs the storm's store to be
// a reserveAgain (scenario.wrap wrapReserveAgain), and fails the test when
// no single Reserve met it: the storm would then prove nothing about the
// step.
func reserveAgainFault(name string, m reserveFault, expect string) fault {
	return fault{
		name:   name,
		expect: expect,
		needs:  "standalone",
		quiet:  m == reserveSlow,
		inject: func(t *testing.T, env *faultEnv) faultResult {
			r, ok := env.store.(*reserveAgain)
			if !ok {
				t.Fatalf("fault %s needs the storm's store wrapped by wrapReserveAgain, got %T", name, env.store)
			}
			start := env.now()
			r.mode.Store(int32(m))
			time.Sleep(loopFor)
			for waited := loopFor; r.met.Load() < reserveAgainMet && waited < reserveAgainMax; waited += loopFor / 10 {
				time.Sleep(loopFor / 10)
			}
			r.mode.Store(int32(reserveAnswers))
			end := env.now()
			n := r.met.Load()
			if n == 0 {
				t.Errorf("fault %s: no single-key Reserve was made while it lasted; the storm did not reach the step", name)
			}
			return faultResult{start: start, end: end, note: fmt.Sprintf("%d single-key Reserves faulted in %v", n, time.Duration(end-start).Round(time.Millisecond))}
		},
	}
}

var (
	faultReserveAgainFails = reserveAgainFault("reserve-again-fails", reserveFails,
		"an entry's second reservation fails (*StorageError in raise, an unprotected run in run) while the rest of Redis answers: "+
			"the batch's other entries run and complete, no extra run, no lost result")
	faultReserveAgainHangs = reserveAgainFault("reserve-again-hangs", reserveHangs,
		"an entry's second reservation is written but its reply never comes: the call times out (*StorageError in raise, "+
			"an unprotected run in run), its pending record runs out after the lease; no other extra run, no lost result")
	faultReserveAgainSlow = reserveAgainFault("reserve-again-slow", reserveSlow,
		"an entry's second reservation answers late, within the storage timeout: no store failure but timeouts, no extra run")
)
