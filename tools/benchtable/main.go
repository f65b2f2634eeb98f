// Command benchtable reads the output of `go test -bench` (of make bench)
// and prints idemkit beside raw go-redis, one row per flow:
//
//	go run ./tools/benchtable bench.out
//	go test -run '^$' -bench . -benchmem ./benchmarks/ | go run ./tools/benchtable
//
// A flow is a benchmark name without its impl= part (and without the -N
// GOMAXPROCS suffix), in its package; impl=idemkit is ours and impl=raw the
// baseline. Each metric is the median of its values over the -count
// repetitions, per impl. Flows that have neither impl=idemkit nor a metric
// of their own (B/record, p50-wake-ms, p99-wake-ms) are left out: benchstat
// shows those. Names outside package benchmarks are prefixed with their
// package's last path element.
//
// The columns: the two ns/op; time, ours/raw of ns/op (above 1 is slower);
// throughput, raw/ours of ns/op, for the flows with callers=N>1 (above 1
// serves more per second); then ours/raw of allocs/op, redis-µs/op,
// redis-cpu-µs/op and B/record; and the waiter's wake-up p50/p99 in ms.
//
// With -md it prints a Markdown table instead of aligned text.
package main

import (
	"flag"
	"fmt"
	"io"
	"os"
)

func main() {
	md := flag.Bool("md", false, "print a Markdown table")
	flag.Usage = func() {
		fmt.Fprintln(flag.CommandLine.Output(), "usage: benchtable [-md] [file ...]  (no file: standard input)")
		flag.PrintDefaults()
	}
	flag.Parse()
	if err := run(os.Stdout, flag.Args(), *md); err != nil {
		fmt.Fprintln(os.Stderr, "benchtable:", err)
		os.Exit(1)
	}
}

func run(w io.Writer, files []string, md bool) error {
	var set resultSet
	if len(files) == 0 {
		if err := set.read(os.Stdin); err != nil {
			return err
		}
	}
	for _, name := range files {
		f, err := os.Open(name)
		if err != nil {
			return err
		}
		err = set.read(f)
		_ = f.Close()
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
	}
	rows := set.rows()
	if len(rows) == 0 {
		return fmt.Errorf("no benchmark with impl=idemkit in the input")
	}
	return render(w, rows, md)
}
