package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// fixture is go test -bench output of two packages, -count 3, with a log line
// in between and a benchmark whose results follow its name on a later line.
const fixture = `goos: linux
goarch: amd64
pkg: github.com/idemkit/idempotency/benchmarks
cpu: AMD EPYC
BenchmarkReplay/callers=1/pipe=off/impl=idemkit-2   	   24816	     60000 ns/op	        26.00 redis-cpu-µs/op	        11.00 redis-µs/op	    2160 B/op	      39 allocs/op
BenchmarkReplay/callers=1/pipe=off/impl=idemkit-2   	   21808	     50000 ns/op	        24.00 redis-cpu-µs/op	        10.00 redis-µs/op	    2160 B/op	      39 allocs/op
BenchmarkReplay/callers=1/pipe=off/impl=idemkit-2   	   21808	     52000 ns/op	        25.00 redis-cpu-µs/op	        10.50 redis-µs/op	    2160 B/op	      39 allocs/op
BenchmarkReplay/callers=1/pipe=off/impl=raw-2       	   39800	     26000 ns/op	        13.00 redis-cpu-µs/op	         0.3800 redis-µs/op	     648 B/op	      15 allocs/op
BenchmarkReplay/callers=1/pipe=off/impl=raw-2       	   48516	     25000 ns/op	        12.00 redis-cpu-µs/op	         0.2500 redis-µs/op	     648 B/op	      15 allocs/op
BenchmarkReplay/callers=64/pipe=off/impl=idemkit-2  	   39350	     28000 ns/op	        19.00 redis-cpu-µs/op	         8.700 redis-µs/op	    2160 B/op	      39 allocs/op
BenchmarkReplay/callers=64/pipe=off/impl=raw-2      	   79375	     14000 ns/op	         8.500 redis-cpu-µs/op	         0.2100 redis-µs/op	     648 B/op	      15 allocs/op
BenchmarkReplay/callers=64/pipe=auto/impl=idemkit-2 	       1	    100000 ns/op
--- SKIP: BenchmarkReplay/callers=64/pipe=auto/impl=idemkit
    helpers_test.go:150: no AutoPipeline
BenchmarkWake/pairs=16/impl=idemkit-2               	      92	  11867790 ns/op	        32.27 p50-wake-ms	       159.8 p99-wake-ms	       435.8 redis-cpu-µs/op	       225.3 redis-µs/op	   12176 B/op	     212 allocs/op
BenchmarkMemory/records=20000/impl=idemkit-2        	    5296	    220412 ns/op	       231.5 B/record	    3680 B/op	      63 allocs/op
BenchmarkMemory/records=20000/impl=raw-2            	   15813	     83656 ns/op	        98.00 B/record	     456 B/op	      13 allocs/op
BenchmarkLogs/impl=raw-2
    flows_test.go:10: a log line
BenchmarkLogs/impl=raw-2                            	     100	      1000 ns/op
PASS
ok  	github.com/idemkit/idempotency/benchmarks	19.052s
goos: linux
goarch: amd64
pkg: github.com/idemkit/idempotency/redisrepo
BenchmarkDo/case=replay/impl=idemkit-2              	   20000	     50000 ns/op	    2000 B/op	      40 allocs/op
BenchmarkDo/case=replay/impl=raw-2                  	   40000	     25000 ns/op	     600 B/op	      10 allocs/op
BenchmarkGet/impl=redisrepo-2                       	   40000	     30000 ns/op	     600 B/op	      10 allocs/op
BenchmarkGet/impl=hgetall-2                         	   40000	     20000 ns/op	     600 B/op	      10 allocs/op
pkg: github.com/idemkit/idempotency/coordinator
BenchmarkDo/replay-2                                	 1000000	      1000 ns/op	     100 B/op	       3 allocs/op
BenchmarkDo/kill-switch-2                           	 1000000	       100 ns/op	       0 B/op	       0 allocs/op
ok  	github.com/idemkit/idempotency/redisrepo	10.000s
`

func TestSplitName(t *testing.T) {
	for _, tc := range []struct{ in, name, impl string }{
		{"BenchmarkReplay/callers=1/pipe=off/impl=raw-2", "BenchmarkReplay/callers=1/pipe=off", "raw"},
		{"BenchmarkReplay/impl=idemkit/callers=1-16", "BenchmarkReplay/callers=1", "idemkit"},
		{"BenchmarkDo/kill-switch-2", "BenchmarkDo/kill-switch", ""},
		{"BenchmarkDo/kill-switch", "BenchmarkDo/kill-switch", ""}, // GOMAXPROCS=1: no suffix
	} {
		name, impl := splitName(tc.in)
		if name != tc.name || impl != tc.impl {
			t.Errorf("splitName(%q) = %q, %q; want %q, %q", tc.in, name, impl, tc.name, tc.impl)
		}
	}
}

func TestRows(t *testing.T) {
	var s resultSet
	if err := s.read(strings.NewReader(fixture)); err != nil {
		t.Fatal(err)
	}
	rows := s.rows()
	var flows []string
	for _, r := range rows {
		flows = append(flows, r.flow)
	}
	want := []string{
		"Replay/callers=1/pipe=off",
		"Replay/callers=64/pipe=off",
		"Replay/callers=64/pipe=auto",
		"Wake/pairs=16",
		"Memory/records=20000",
		"redisrepo: Do/case=replay",
	}
	if strings.Join(flows, "\n") != strings.Join(want, "\n") {
		t.Fatalf("flows:\n%s\nwant:\n%s", strings.Join(flows, "\n"), strings.Join(want, "\n"))
	}

	r := rows[0]
	// Medians: of 3 values the middle one, of 2 the mean.
	for unit, want := range map[string]float64{"ns/op": 52000, "redis-µs/op": 10.5, "allocs/op": 39} {
		if got := r.ours[unit]; got != want {
			t.Errorf("idemkit %s = %v, want %v", unit, got, want)
		}
	}
	for unit, want := range map[string]float64{"ns/op": 25500, "redis-µs/op": 0.315} {
		if got := r.raw[unit]; got != want {
			t.Errorf("raw %s = %v, want %v", unit, got, want)
		}
	}
	if r.parallel || !rows[1].parallel {
		t.Errorf("parallel = %v, %v; want false, true", r.parallel, rows[1].parallel)
	}

	for i, want := range [][]string{
		{"Replay/callers=1/pipe=off", "52µs", "25.5µs", "2.04×", "-", "39 / 15", "10.5 / 0.32", "25 / 12.5", "-", "-"},
		{"Replay/callers=64/pipe=off", "28µs", "14µs", "2.00×", "0.50×", "39 / 15", "8.70 / 0.21", "19 / 8.50", "-", "-"},
		{"Replay/callers=64/pipe=auto", "100µs", "-", "-", "-", "-", "-", "-", "-", "-"},
		{"Wake/pairs=16", "11.9ms", "-", "-", "-", "212", "225", "436", "-", "32.3 / 160"},
		{"Memory/records=20000", "220µs", "83.7µs", "2.63×", "-", "63 / 13", "-", "-", "232 / 98", "-"},
	} {
		if got := rows[i].cells(); strings.Join(got, "|") != strings.Join(want, "|") {
			t.Errorf("row %d:\n got %q\nwant %q", i, got, want)
		}
	}
}

func TestRender(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "bench.out")
	if err := os.WriteFile(file, []byte(fixture), 0o644); err != nil {
		t.Fatal(err)
	}
	var text, md bytes.Buffer
	if err := run(&text, []string{file}, false); err != nil {
		t.Fatal(err)
	}
	if err := run(&md, []string{file}, true); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(text.String(), "\n")
	if !strings.HasPrefix(lines[0], "flow ") || !strings.Contains(lines[0], "wake ms p50/p99") {
		t.Errorf("text header: %q", lines[0])
	}
	if !strings.HasPrefix(lines[1], "Replay/callers=1/pipe=off ") || !strings.Contains(lines[1], "2.04×") {
		t.Errorf("text row: %q", lines[1])
	}
	if !strings.Contains(md.String(), "| Wake/pairs=16 | 11.9ms | - |") || !strings.Contains(md.String(), "|---|---|") {
		t.Errorf("markdown:\n%s", md.String())
	}

	if err := run(&text, []string{filepath.Join(dir, "missing.out")}, false); err == nil {
		t.Error("a missing file: no error")
	}
	empty := filepath.Join(dir, "empty.out")
	if err := os.WriteFile(empty, []byte("PASS\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := run(&text, []string{empty}, false); err == nil {
		t.Error("no benchmark: no error")
	}
}
