package redisstream_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idempotency/coordinator"
	"github.com/idemkit/idempotency/idemconsume"
	"github.com/idemkit/idempotency/idemconsume/redisstream"
	"github.com/idemkit/idempotency/internal/redistest"
	"github.com/idemkit/idempotency/redisrepo"
)

// The crashing consumer: the test binary started with crashEnv set runs
// runCrasher instead of the tests, configured by these variables.
const (
	crashEnv    = "REDISSTREAM_TEST_CRASHER"
	crashAddr   = "REDISSTREAM_TEST_REDIS_ADDR"
	crashDB     = "REDISSTREAM_TEST_REDIS_DB"
	crashPrefix = "REDISSTREAM_TEST_PREFIX"
	crashStream = "REDISSTREAM_TEST_STREAM"
	crashGroup  = "REDISSTREAM_TEST_GROUP"
	crashName   = "REDISSTREAM_TEST_CONSUMER"
	// crashCode is the crasher's exit status when it dies on the poison.
	crashCode = 3
	// poisonKey is the key of the entry that kills its consumer.
	poisonKey = "order-poison"
	// crashMaxDeliveries is the crasher's idemconsume.WithMaxDeliveries.
	crashMaxDeliveries = 3
)

// runCrasher consumes the stream in batches of 10; its handler counts each
// run in a hash, and exits the process (a crash: no deferred function, no
// acknowledgement, no release) on the poison entry.
func runCrasher() int {
	fail := func(err error) int { fmt.Fprintln(os.Stderr, "crasher:", err); return 1 }
	db, _ := strconv.Atoi(os.Getenv(crashDB))
	rdb := redis.NewClient(&redis.Options{Addr: os.Getenv(crashAddr), DB: db})
	prefix := os.Getenv(crashPrefix)
	// A killed consumer's reservation outlives it by a lease: shorter than
	// the min-idle below, so that a claimed entry's key is free again.
	c, err := coordinator.New(redisrepo.New(rdb, redisrepo.WithKeyPrefix(prefix+"idem:")), coordinator.WithLease(300*time.Millisecond), coordinator.WithStorageTimeout(100*time.Millisecond))
	if err != nil {
		return fail(err)
	}
	p, err := idemconsume.New(c, "billing.credit", idemconsume.WithMaxDeliveries(crashMaxDeliveries))
	if err != nil {
		return fail(err)
	}
	runs := prefix + "runs"
	consumer, err := redisstream.New(rdb, p, os.Getenv(crashStream), os.Getenv(crashGroup),
		func(ctx context.Context, m idemconsume.Message) error {
			key := m.Fields["idempotency-key"]
			if key == poisonKey {
				os.Exit(crashCode)
			}
			return rdb.HIncrBy(ctx, runs, key, 1).Err()
		},
		redisstream.WithConsumerName(os.Getenv(crashName)), redisstream.WithBatchSize(10),
		redisstream.WithBlock(20*time.Millisecond), redisstream.WithMinIdle(400*time.Millisecond),
		redisstream.WithClaimInterval(20*time.Millisecond))
	if err != nil {
		return fail(err)
	}
	return fail(consumer.Run(context.Background()))
}

// An entry that kills its consumer every time (an out-of-memory, a crash in
// a C library: nothing a recover catches) is dead-lettered after
// WithMaxDeliveries deliveries, alone: the entries of its batch that its
// crashes kept from running are claimed one at a time after it, each
// charged its own delivery only, and processed. Once as a restarted process
// under a new name (taking over by claims), once under the same name
// (taking back its own pending entries).
func TestCrashingEntryDoesNotTakeItsBatchMates(t *testing.T) {
	for _, sameName := range []bool{false, true} {
		t.Run("same-name="+strconv.FormatBool(sameName), func(t *testing.T) {
			redistest.NeedRedisServer(t)
			e := newEnv(t)
			ropts := redistest.ServerOptions(t)
			prefix := redistest.Prefix(t)
			var keys []string
			for i := range 10 {
				key := "order-" + strconv.Itoa(i)
				if i == 3 {
					key = poisonKey
				} else {
					keys = append(keys, key)
				}
				e.publish(key)
			}
			env := append(os.Environ(), crashEnv+"=1", crashAddr+"="+ropts.Addr, crashDB+"="+strconv.Itoa(ropts.DB),
				crashPrefix+"="+prefix, crashStream+"="+e.stream, crashGroup+"="+e.group)
			crashes := 0
			for life := 0; !e.drained(); life++ {
				if life == 2*crashMaxDeliveries+4 {
					t.Fatalf("the stream is not drained after %d lives, %d crashes", life, crashes)
				}
				name := "pod-" + strconv.Itoa(life)
				if sameName {
					name = "pod"
				}
				cmd := exec.Command(os.Args[0], "-test.run=^$")
				cmd.Env = append(env, crashName+"="+name)
				cmd.Stderr = os.Stderr
				if err := cmd.Start(); err != nil {
					t.Fatal(err)
				}
				done := make(chan error, 1)
				go func() { done <- cmd.Wait() }()
				if err := waitOrDrain(e, done, 10*time.Second); err != nil {
					var exit *exec.ExitError
					if !errors.As(err, &exit) || exit.ExitCode() != crashCode {
						_ = cmd.Process.Kill()
						t.Fatalf("the consumer ended with %v, want exit status %d", err, crashCode)
					}
					crashes++
					continue
				}
				// It lived, and drained the stream.
				_ = cmd.Process.Kill()
				<-done
			}
			// A delivery of the poison that finds its key still held by the
			// process it killed (its lease not yet run out) is a Retry: it
			// counts as a delivery without a crash.
			if crashes < 1 || crashes > crashMaxDeliveries {
				t.Errorf("%d crashes, want 1 to %d (at most one per delivery of the poison)", crashes, crashMaxDeliveries)
			}
			dead, err := e.rdb.XRange(t.Context(), e.stream+redisstream.DeadLetterSuffix, "-", "+").Result()
			if err != nil {
				t.Fatal(err)
			}
			if len(dead) != 1 || dead[0].Values["idempotency-key"] != poisonKey ||
				dead[0].Values[redisstream.FieldDeadReason] != string(idemconsume.ReasonMaxDeliveries) {
				t.Errorf("dead letters %v, want the poison alone, for its deliveries", dead)
			}
			runs, err := e.rdb.HGetAll(t.Context(), prefix+"runs").Result()
			if err != nil {
				t.Fatal(err)
			}
			for _, k := range keys {
				// An entry before the poison may run twice: a crash can land
				// between its handler and its record's completion.
				if n, _ := strconv.Atoi(runs[k]); n < 1 {
					t.Errorf("%s ran %d times, want at least once", k, n)
				}
			}
			for _, k := range keys[3:] {
				if runs[k] != "1" {
					t.Errorf("%s, after the poison, ran %s times, want once", k, runs[k])
				}
			}
			t.Logf("%d crashes; runs %v; dead letters %v", crashes, runs, dead)
		})
	}
}

// waitOrDrain waits until the process whose Wait done reports exits
// (returning its error, or errLived for a clean exit) or e's stream is
// drained (returning nil), for at most d.
func waitOrDrain(e *env, done <-chan error, d time.Duration) error {
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	deadline := time.After(d)
	for {
		select {
		case err := <-done:
			if err == nil {
				return errLived
			}
			return err
		case <-tick.C:
			if e.drained() {
				return nil
			}
		case <-deadline:
			return fmt.Errorf("neither a crash nor a drained stream in %v", d)
		}
	}
}

var errLived = errors.New("the consumer exited by itself")
