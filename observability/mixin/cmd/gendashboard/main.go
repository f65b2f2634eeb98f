// Command gendashboard writes the Grafana dashboard of
// github.com/idemkit/idempotency's metrics.
//
//	gendashboard [-namespace NS] [-o FILE]
//
// Without -o it writes to standard output. -namespace prefixes the metric
// names as observability.WithNamespace does (shop: shop_idempotency_...);
// the committed dashboard.json has none.
package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/idemkit/idempotency/observability/mixin"
)

func main() {
	namespace := flag.String("namespace", "", "metric name prefix set with observability.WithNamespace")
	out := flag.String("o", "", "output file (default: standard output)")
	flag.Parse()
	data, err := mixin.Dashboard(*namespace)
	if err == nil {
		if *out == "" {
			_, err = os.Stdout.Write(data)
		} else {
			err = os.WriteFile(*out, data, 0o644)
		}
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "gendashboard:", err)
		os.Exit(1)
	}
}
