// Package benchmarks measures every flow of idemkit side by side with the
// least that a correct hand-written idempotency check on raw go-redis must
// do, in the same run, against the same redis-server. It holds no code, only
// benchmarks (its _test.go files).
//
// Each flow is a benchmark whose sub-benchmarks differ in the impl key,
// impl=idemkit (coordinator.Do over a redisrepo store) and impl=raw (plain
// go-redis commands and encoding/json), so that benchstat compares them:
//
//	BenchmarkReplay     a completed key: Do vs GET + json.Unmarshal
//	BenchmarkFirstRun   a new key: Do vs SET NX PX lease, then SET PX ttl
//	BenchmarkRefused    a key held by another caller, mode raise: Do
//	                    (ErrInProgress) vs a SET NX PX that fails
//	BenchmarkWake       two coordinators on two clients (two processes):
//	                    how long after the holder's Do returns the waiter's
//	                    Do returns (p50-wake-ms, p99-wake-ms); idemkit only
//	BenchmarkMemory     used_memory per completed record (B/record)
//	BenchmarkObserver   the fx module's observer alone: its coordinator
//	                    over an in-memory store without (impl=idemkit) and
//	                    with (impl=fx) the default observer; no Redis
//	BenchmarkCallerCPU  raw's refusal through AutoPipeline at 64 callers,
//	                    each burning cpu of its own before each command:
//	                    what the callers' own work costs per call
//
// Replay, FirstRun and Refused run with callers=1 and callers=64 (64
// goroutines at once, whatever the number of cores), each with pipe=off (a
// plain *redis.Client) and pipe=auto (its AutoPipeline). With pipe=off,
// two more impls run beside them: impl=valkey-go, raw's commands through
// valkey-go with its default auto-pipelining (the client of
// faustbrian/go-idempotency: a floor under that library's time), and
// impl=fx, Do on the coordinator of the fx module with the observer an app
// gets by default (metrics, zap logs, OpenTelemetry), to set beside
// impl=idemkit's bare coordinator. Every benchmark
// reports allocs/op, redis-µs/op (the server's time in the commands the
// clients sent, per operation, from INFO commandstats: a script's line
// includes the commands it runs, which are not counted again) and
// redis-cpu-µs/op (the server process's CPU per operation, from INFO cpu:
// reading requests and writing replies included). Both are the server's
// clock, so a machine busy with other work inflates them, as it does ns/op.
//
// The benchmarks start their own redis-server through internal/redistest
// and skip without one (miniredis cannot stand in for Redis's CPU and memory
// figures, and they flush the server, so they do not run against a server
// named by IDEMPOTENCY_TEST_REDIS_URL either). Run them with
//
//	make bench        # every package, -count 6, into bench.out
//	make bench-table  # the table: idemkit beside raw, medians of the six runs
//
// or, for this package alone and a quick look,
//
//	go test -run '^$' -bench . -benchmem -count 1 ./benchmarks/ | tee b.out
//	go run ./tools/benchtable b.out
//	go run golang.org/x/perf/cmd/benchstat@latest -col /impl b.out
package benchmarks
