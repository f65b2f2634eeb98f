package main

import (
	"bufio"
	"fmt"
	"io"
	"path"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
)

// The impls that the table puts side by side.
const (
	implOurs = "idemkit"
	implRaw  = "raw"
)

// The units the table reads.
const (
	unitNs       = "ns/op"
	unitAllocs   = "allocs/op"
	unitRedisUs  = "redis-µs/op"
	unitRedisCPU = "redis-cpu-µs/op"
	unitRecord   = "B/record"
	unitWakeP50  = "p50-wake-ms"
	unitWakeP99  = "p99-wake-ms"
)

// resultSet holds the values read, grouped by flow (package and benchmark
// name without impl=) in the order first seen.
type resultSet struct {
	groups []*group
	byKey  map[string]*group
}

type group struct {
	pkg, name string
	// values holds, per impl ("" for a name without impl=) and unit, one
	// value per repetition.
	values map[string]map[string][]float64
}

// read adds the benchmark lines of r: "BenchmarkName-N  iterations  value
// unit  value unit ...". Other lines are skipped, except "pkg: path", which
// sets the package of the lines after it.
func (s *resultSet) read(r io.Reader) error {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64*1024), 1024*1024)
	pkg := ""
	for sc.Scan() {
		line := sc.Text()
		if p, ok := strings.CutPrefix(line, "pkg: "); ok {
			pkg = strings.TrimSpace(p)
			continue
		}
		if !strings.HasPrefix(line, "Benchmark") {
			continue
		}
		f := strings.Fields(line)
		// A name whose results are on a later line (the benchmark logged
		// something in between) has no iteration count here: skipped.
		if len(f) < 4 || len(f)%2 != 0 {
			continue
		}
		if _, err := strconv.ParseInt(f[1], 10, 64); err != nil {
			continue
		}
		name, impl := splitName(f[0])
		g := s.group(pkg, name)
		for i := 2; i < len(f); i += 2 {
			v, err := strconv.ParseFloat(f[i], 64)
			if err != nil {
				return fmt.Errorf("%q: value %q: %w", line, f[i], err)
			}
			if g.values[impl] == nil {
				g.values[impl] = map[string][]float64{}
			}
			g.values[impl][f[i+1]] = append(g.values[impl][f[i+1]], v)
		}
	}
	return sc.Err()
}

func (s *resultSet) group(pkg, name string) *group {
	key := pkg + "\x00" + name
	if g, ok := s.byKey[key]; ok {
		return g
	}
	if s.byKey == nil {
		s.byKey = map[string]*group{}
	}
	g := &group{pkg: pkg, name: name, values: map[string]map[string][]float64{}}
	s.byKey[key] = g
	s.groups = append(s.groups, g)
	return g
}

// splitName returns a benchmark's name without its -N GOMAXPROCS suffix and
// without its impl=X element, and X ("" without one).
func splitName(full string) (name, impl string) {
	if i := strings.LastIndexByte(full, '-'); i > 0 && i < len(full)-1 {
		if _, err := strconv.Atoi(full[i+1:]); err == nil {
			full = full[:i]
		}
	}
	parts := strings.Split(full, "/")
	kept := parts[:0]
	for _, p := range parts {
		if v, ok := strings.CutPrefix(p, "impl="); ok {
			impl = v
			continue
		}
		kept = append(kept, p)
	}
	return strings.Join(kept, "/"), impl
}

// row is one flow of the table: the median of each metric, per impl.
type row struct {
	flow     string
	parallel bool               // callers=N with N > 1
	ours     map[string]float64 // never nil
	raw      map[string]float64 // nil without impl=raw
}

func (s *resultSet) rows() []row {
	var rows []row
	for _, g := range s.groups {
		ours, ok := g.values[implOurs]
		if !ok {
			ours = g.values[""]
			if ours[unitRecord] == nil && ours[unitWakeP50] == nil && ours[unitWakeP99] == nil {
				continue
			}
		}
		r := row{flow: flowName(g.pkg, g.name), parallel: parallel(g.name), ours: medians(ours)}
		if raw, ok := g.values[implRaw]; ok {
			r.raw = medians(raw)
		}
		rows = append(rows, r)
	}
	return rows
}

// flowName is the benchmark name without "Benchmark", prefixed with its
// package's last element unless that is benchmarks.
func flowName(pkg, name string) string {
	name = strings.TrimPrefix(name, "Benchmark")
	if base := path.Base(pkg); pkg != "" && base != "benchmarks" {
		return base + ": " + name
	}
	return name
}

func parallel(name string) bool {
	for p := range strings.SplitSeq(name, "/") {
		if v, ok := strings.CutPrefix(p, "callers="); ok {
			n, err := strconv.Atoi(v)
			return err == nil && n > 1
		}
	}
	return false
}

func medians(m map[string][]float64) map[string]float64 {
	out := make(map[string]float64, len(m))
	for unit, vs := range m {
		out[unit] = median(vs)
	}
	return out
}

func median(vs []float64) float64 {
	s := slices.Clone(vs)
	slices.Sort(s)
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

var header = []string{"flow", "idemkit", "raw", "time", "throughput", "allocs/op", "redis-µs/op", "redis-cpu-µs/op", "B/record", "wake ms p50/p99"}

const legend = "idemkit and raw: ns/op. time: idemkit/raw ns/op (above 1: slower). throughput: raw/idemkit ns/op, " +
	"for callers>1 (above 1: more per second). Cells with two values: idemkit / raw. Medians over the repetitions."

// cells returns the row's cells, in the order of header.
func (r row) cells() []string {
	raw := func(unit string) (float64, bool) {
		v, ok := r.raw[unit]
		return v, ok
	}
	ours := func(unit string) (float64, bool) {
		v, ok := r.ours[unit]
		return v, ok
	}
	c := []string{r.flow, "-", "-", "-", "-"}
	on, okO := ours(unitNs)
	rn, okR := raw(unitNs)
	if okO {
		c[1] = duration(on)
	}
	if okR {
		c[2] = duration(rn)
	}
	if okO && okR && on > 0 && rn > 0 {
		c[3] = ratio(on / rn)
		if r.parallel {
			c[4] = ratio(rn / on)
		}
	}
	for _, unit := range []string{unitAllocs, unitRedisUs, unitRedisCPU, unitRecord} {
		c = append(c, pair(ours, raw, unit))
	}
	p50, ok50 := ours(unitWakeP50)
	p99, ok99 := ours(unitWakeP99)
	switch {
	case ok50 && ok99:
		c = append(c, number(p50)+" / "+number(p99))
	case ok50:
		c = append(c, number(p50)+" / -")
	case ok99:
		c = append(c, "- / "+number(p99))
	default:
		c = append(c, "-")
	}
	return c
}

// pair is "ours / raw", or ours alone without raw, or "-".
func pair(ours, raw func(string) (float64, bool), unit string) string {
	o, okO := ours(unit)
	r, okR := raw(unit)
	switch {
	case okO && okR:
		return number(o) + " / " + number(r)
	case okO:
		return number(o)
	case okR:
		return "- / " + number(r)
	}
	return "-"
}

// number prints v with about three significant digits, integers whole.
func number(v float64) string {
	switch {
	case v == float64(int64(v)):
		return strconv.FormatInt(int64(v), 10)
	case v >= 100 || v <= -100:
		return strconv.FormatFloat(v, 'f', 0, 64)
	case v >= 10 || v <= -10:
		return strconv.FormatFloat(v, 'f', 1, 64)
	default:
		return strconv.FormatFloat(v, 'f', 2, 64)
	}
}

func ratio(v float64) string { return strconv.FormatFloat(v, 'f', 2, 64) + "×" }

// duration prints ns in ns, µs, ms or s.
func duration(ns float64) string {
	switch {
	case ns < 1e3:
		return number(ns) + "ns"
	case ns < 1e6:
		return number(ns/1e3) + "µs"
	case ns < 1e9:
		return number(ns/1e6) + "ms"
	default:
		return number(ns/1e9) + "s"
	}
}

func render(w io.Writer, rows []row, md bool) error {
	if md {
		var b strings.Builder
		b.WriteString("| " + strings.Join(header, " | ") + " |\n")
		b.WriteString("|" + strings.Repeat("---|", len(header)) + "\n")
		for _, r := range rows {
			b.WriteString("| " + strings.Join(r.cells(), " | ") + " |\n")
		}
		b.WriteString("\n" + legend + "\n")
		_, err := io.WriteString(w, b.String())
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, strings.Join(header, "\t"))
	for _, r := range rows {
		fmt.Fprintln(tw, strings.Join(r.cells(), "\t"))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	_, err := fmt.Fprintln(w, "\n"+legend)
	return err
}
