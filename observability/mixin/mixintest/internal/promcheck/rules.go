package promcheck

import (
	"fmt"
	"io"
	"log/slog"
	"maps"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/rulefmt"
)

// CheckRulesFile parses a Prometheus rules file as Prometheus does (which
// also checks that each expression parses and each template is valid) and
// checks every rule's expression with CheckExpr. The series a recording rule
// defines may be used by the other rules: they are added to a copy of the
// schema, with the labels their expression can have.
func (c *Checker) CheckRulesFile(path string) []error {
	groups, errs := rulefmt.ParseFile(path, false, model.UTF8Validation, c.parser, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if len(errs) > 0 {
		return errs
	}
	schema := &Schema{Series: maps.Clone(c.Schema.Series)}
	rc := &Checker{Schema: schema, parser: c.parser}
	// Two passes, so that a rule may use a series recorded further down.
	for range 2 {
		for _, g := range groups.Groups {
			for _, r := range g.Rules {
				if r.Record == "" {
					continue
				}
				expr, err := c.parser.ParseExpr(r.Expr)
				if err != nil {
					continue // reported by ParseFile
				}
				set, _ := rc.outputLabels(expr)
				se := &Series{Recorded: true, Labels: map[string]map[string]bool{}}
				for l := range set {
					se.Labels[l] = map[string]bool{}
				}
				for l, v := range g.Labels {
					se.Labels[l] = map[string]bool{v: true}
				}
				for l, v := range r.Labels {
					se.Labels[l] = map[string]bool{v: true}
				}
				schema.Series[r.Record] = se
			}
		}
	}
	var out []error
	for _, g := range groups.Groups {
		for _, r := range g.Rules {
			name := r.Alert
			if name == "" {
				name = r.Record
			}
			for _, err := range rc.CheckExpr(r.Expr) {
				out = append(out, fmt.Errorf("%s: group %q, rule %s: %w", path, g.Name, name, err))
			}
		}
	}
	return out
}
