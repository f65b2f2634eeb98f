package observability_test

import (
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemkit/idempotency/observability"
)

// The cardinality that docs/observability.md states is what an Observer
// creates: the series per operation, those of storage_duration_seconds,
// and the worst case with the default operation limit.
func TestCardinalityIsTheDocumented(t *testing.T) {
	count := func(ops ...string) (perOp, storage, collectors int) {
		reg := prometheus.NewRegistry()
		if _, err := observability.New(observability.WithRegisterer(reg), observability.WithOperations(ops...)); err != nil {
			t.Fatal(err)
		}
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			n := 0
			for _, m := range mf.GetMetric() {
				switch {
				case m.GetHistogram() != nil:
					n += len(m.GetHistogram().GetBucket()) + 3 // the buckets, +Inf, _sum and _count
				default:
					n++
				}
			}
			if strings.HasSuffix(mf.GetName(), "storage_duration_seconds") {
				storage += n
			} else {
				perOp += n
			}
		}
		return perOp, storage, len(mfs)
	}
	perOp, storage, collectors := count("a")
	doc, err := os.ReadFile("../docs/observability.md")
	if err != nil {
		t.Fatal(err)
	}
	worst := 51*perOp + storage
	for _, want := range []string{
		itoa(perOp) + " series in all; plus " + itoa(storage) + " for `storage_duration_seconds`",
		"its " + itoa(storage) + " series by",
		"51 × " + itoa(perOp) + " + " + itoa(storage) + " = " + thousands(worst),
		"its " + numberWord[collectors] + " collectors",
	} {
		if !strings.Contains(string(doc), want) {
			t.Errorf("docs/observability.md does not say %q (%d series per operation, %d of storage_duration_seconds, %d collectors)", want, perOp, storage, collectors)
		}
	}
}

func itoa(n int) string { return strconv.Itoa(n) }

// thousands writes n with a comma between thousands, as the docs do.
func thousands(n int) string {
	s := strconv.Itoa(n)
	if len(s) <= 3 {
		return s
	}
	return s[:len(s)-3] + "," + s[len(s)-3:]
}

// numberWord spells the small numbers the docs spell.
var numberWord = map[int]string{6: "six", 7: "seven", 8: "eight", 9: "nine", 10: "ten"}
