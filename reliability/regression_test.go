//go:build linux

package reliability_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/idemkit/idempotency/coordinator"
	"github.com/idemkit/idempotency/redisrepo"
)

// Regressions: reproductions of what the storms found, kept as tests.

// TestStallEndingLateInTheLeaseKeepsTheResult: a Redis that stalls right
// after an action ran and comes back in the last tenth of the lease (0.96s
// after the reservation, of a 1s lease) delays the save but does not lose
// it, and the client's retry replays the result (docs/architecture.md, "A
// result that ran is stored if the store lets it"). A storm found this lost
// (5 of 5 trials here) while the background save backed off to the renew
// interval and sent its last attempt before Redis returned; its rounds now
// come closer together as the lease runs out.
func TestStallEndingLateInTheLeaseKeepsTheResult(t *testing.T) {
	suiteLevel(t)
	const trials = 5
	lost := 0
	for i := range trials {
		b, env := startStandalone(t, false)
		client := b.client(t)
		c, err := coordinator.New(redisrepo.New(client),
			coordinator.WithLease(lease), coordinator.WithStorageTimeout(storageTimeout), coordinator.WithRenewInterval(renewInterval),
			coordinator.WithOnStorageError(coordinator.OnStorageErrorRaise))
		if err != nil {
			t.Fatal(err)
		}
		call := coordinator.Call{Operation: "stall.late", Key: "k" + strconv.Itoa(i)}
		stalled := make(chan error, 1)
		runs := 0
		action := func(context.Context) (string, error) {
			runs++
			if runs == 1 {
				// Redis stalls from now until 0.95s later: 0.96s after the
				// reservation, before its lease ends.
				go func() { stalled <- env.admin.Do(context.Background(), "DEBUG", "SLEEP", "0.95").Err() }()
				time.Sleep(5 * time.Millisecond)
			}
			return "run " + strconv.Itoa(runs), nil
		}
		if _, err := coordinator.Do(context.Background(), c, call, action); err != nil {
			t.Fatal(err)
		}
		if err := <-stalled; err != nil {
			t.Fatal(err)
		}
		_ = c.Close() // the background save has ended
		// The client's retry.
		v, err := coordinator.Do(context.Background(), c, call, action)
		if err != nil {
			t.Fatal(err)
		}
		if v != "run 1" {
			lost++
		}
		_ = client.Close()
	}
	if lost > 0 {
		t.Errorf("%d of %d trials lost the result of a run whose Redis came back within the lease, and ran it again", lost, trials)
	}
}
