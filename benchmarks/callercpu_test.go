package benchmarks

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"
)

// BenchmarkCallerCPU is raw's refusal (a SET NX PX that fails) through the
// AutoPipeliner with 64 callers, each burning cpu of its own CPU before each
// command: how much time per call a microsecond of the callers' own work
// costs when they share the cores with the pipeliner's goroutines and with
// Redis. idemkit's engine and store are such work, on top of raw's, so this
// is what separates BenchmarkRefused's pipe=auto rows (docs/performance.md,
// "What a caller's CPU costs").
func BenchmarkCallerCPU(b *testing.B) {
	ctx := context.Background()
	adm := admin(b)
	flush(b, adm)
	s := newSide(b, pipeAuto)
	rawKey := s.rawKey(newKeyGen().key(0))
	if err := s.cmd.Set(ctx, rawKey, "holder-token", time.Hour).Err(); err != nil {
		b.Fatal(err)
	}
	perMicro := spinsPerMicrosecond()
	for _, cpu := range []time.Duration{0, time.Microsecond, 2 * time.Microsecond, 4 * time.Microsecond} {
		n := int(cpu/time.Microsecond) * perMicro
		b.Run(fmt.Sprintf("callers=64/cpu=%v", cpu), func(b *testing.B) {
			measure(b, adm, 64, func(int) error {
				spin(n)
				return rawRefused(ctx, s.cmd, rawKey)
			})
		})
	}
}

// spinSink keeps spin's work from being optimised away.
var spinSink uint64

// spin does n rounds of a little arithmetic: CPU work that allocates
// nothing and makes no call, whatever the goroutine's scheduling.
func spin(n int) {
	x := spinSink
	for range n {
		x = x*6364136223846793005 + 1442695040888963407
	}
	spinSink = x
}

// spinsPerMicrosecond is how many rounds of spin take a microsecond on this
// machine: the fastest of a few timings of a million rounds, so that a
// preemption during one does not count.
var spinsPerMicrosecond = sync.OnceValue(func() int {
	const rounds = 1_000_000
	best := time.Duration(1<<63 - 1)
	for range 5 {
		start := time.Now()
		spin(rounds)
		if d := time.Since(start); d < best {
			best = d
		}
	}
	return max(1, int(rounds*int64(time.Microsecond)/int64(best)))
})
