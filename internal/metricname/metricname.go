// Package metricname holds the rule for the metric name prefix that
// observability.WithNamespace (IDEMPOTENCY_METRICS_NAMESPACE) sets, so that
// observability and its mixin's dashboard accept the same prefixes.
package metricname

import "fmt"

// CheckNamespace returns nil when ns is "" or a classic Prometheus metric
// name (letters, digits and underscores, not starting with a digit; no
// colons, which are for recording rules), else an error that says so.
func CheckNamespace(ns string) error {
	for i := 0; i < len(ns); i++ {
		c := ns[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || c == '_' || i > 0 && '0' <= c && c <= '9') {
			return fmt.Errorf("%q is not a Prometheus name; use letters, digits and underscores, not starting with a digit", ns)
		}
	}
	return nil
}
