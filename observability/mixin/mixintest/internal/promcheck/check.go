package promcheck

import (
	"errors"
	"fmt"
	"regexp"
	"sort"
	"strings"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql/parser"
)

// counterFuncs take a range of a counter.
var counterFuncs = map[string]bool{"rate": true, "irate": true, "increase": true, "resets": true}

// Checker checks PromQL expressions against a Schema.
type Checker struct {
	Schema *Schema
	parser parser.Parser
}

// NewChecker returns a Checker of expressions against s.
func NewChecker(s *Schema) *Checker {
	return &Checker{Schema: s, parser: parser.NewParser(parser.Options{})}
}

// CheckExpr parses expr and checks that every series it selects is in the
// schema, with only labels the series has and, in label matchers, only
// values the library documents; that rate() and the like are applied to
// counters, histogram_quantile() to buckets aggregated by le, and that every
// "by" label exists on what is aggregated. It returns every problem found.
func (c *Checker) CheckExpr(expr string) []error {
	root, err := c.parser.ParseExpr(expr)
	if err != nil {
		return []error{fmt.Errorf("parse: %w", err)}
	}
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	parser.Inspect(root, func(node parser.Node, _ []parser.Node) error {
		switch n := node.(type) {
		case *parser.VectorSelector:
			errs = append(errs, c.checkSelector(n)...)
		case *parser.Call:
			name := n.Func.Name
			if counterFuncs[name] && len(n.Args) == 1 {
				if ms, ok := n.Args[0].(*parser.MatrixSelector); ok {
					if vs, ok := ms.VectorSelector.(*parser.VectorSelector); ok {
						for series, se := range c.selected(vs) {
							if !se.Counter {
								bad("%s() of %s, which is not a counter", name, series)
							}
						}
					}
				}
			}
			if name == "histogram_quantile" && len(n.Args) == 2 {
				arg := unparen(n.Args[1])
				if agg, ok := arg.(*parser.AggregateExpr); ok && !agg.Without && !contains(agg.Grouping, "le") {
					bad("histogram_quantile() over %s by (%s): the grouping drops le", agg.Op, strings.Join(agg.Grouping, ", "))
				}
				for _, vs := range selectors(arg) {
					for series, se := range c.selected(vs) {
						if !se.Bucket && !se.Recorded {
							bad("histogram_quantile() of %s, which is not a histogram's _bucket series", series)
						}
					}
				}
			}
		case *parser.AggregateExpr:
			if n.Without || len(n.Grouping) == 0 {
				break
			}
			have, _ := c.outputLabels(n.Expr)
			for _, l := range n.Grouping {
				if !have[l] {
					bad("%s by (%s): no series aggregated there has label %q", n.Op, strings.Join(n.Grouping, ", "), l)
				}
			}
		}
		return nil
	})
	return errs
}

// checkSelector checks one selector's name, label names and values.
func (c *Checker) checkSelector(vs *parser.VectorSelector) []error {
	sel := c.selected(vs)
	if len(sel) == 0 {
		name := vs.Name
		if name == "" {
			name = vs.String()
		}
		return []error{fmt.Errorf("%s: no such series; the library exports %s", name, strings.Join(c.Schema.Names(), ", "))}
	}
	var errs []error
	for _, m := range vs.LabelMatchers {
		if m.Name == model.MetricNameLabel {
			continue
		}
		found := false
		for _, se := range sel {
			if _, ok := se.Labels[m.Name]; ok {
				found = true
				break
			}
		}
		if !found {
			errs = append(errs, fmt.Errorf("%s: label %q does not exist on %s (it has %s)", vs, m.Name, names(sel), labelsOf(sel)))
			continue
		}
		for series, se := range sel {
			if _, ok := se.Labels[m.Name]; !ok {
				continue
			}
			d, ok := documentedDomain(series, se, m.Name)
			if !ok {
				continue
			}
			if err := checkMatcherValue(m, d); err != nil {
				errs = append(errs, fmt.Errorf("%s: %s on %s: %w", vs, m, series, err))
			}
		}
	}
	return errs
}

// selected returns the schema's series that vs selects by name.
func (c *Checker) selected(vs *parser.VectorSelector) map[string]*Series {
	out := map[string]*Series{}
	if vs.Name != "" {
		if se, ok := c.Schema.Series[vs.Name]; ok {
			out[vs.Name] = se
		}
		return out
	}
	for _, m := range vs.LabelMatchers {
		if m.Name != model.MetricNameLabel {
			continue
		}
		for name, se := range c.Schema.Series {
			if m.Matches(name) {
				out[name] = se
			}
		}
	}
	return out
}

// plainAlternation matches a regular expression that is only literal
// values separated by |.
var plainAlternation = regexp.MustCompile(`^[A-Za-z0-9_:~-]*(\|[A-Za-z0-9_:~-]*)*$`)

// checkMatcherValue checks the value of m against the documented values d:
// an equality's value must be one of them, each value of a regular
// expression that is an alternation of values must be, and any other
// regular expression must match at least one of them.
func checkMatcherValue(m *labels.Matcher, d domain) error {
	switch m.Type {
	case labels.MatchEqual, labels.MatchNotEqual:
		if m.Value == "" {
			return errors.New("an empty value matches series without the label, and every series has it")
		}
		return d.valid(m.Value)
	}
	if d.check == nil && plainAlternation.MatchString(m.Value) {
		var errs []error
		for _, v := range strings.Split(m.Value, "|") {
			if err := d.valid(v); err != nil {
				errs = append(errs, err)
			}
		}
		return errors.Join(errs...)
	}
	if d.check != nil {
		return nil // an open set: any regular expression may match
	}
	for v := range d.values {
		if m.Matches(v) {
			return nil
		}
	}
	return fmt.Errorf("%q matches none of %s", m.Value, d)
}

// outputLabels returns the label names of the series expr returns; exact is
// false when that is an upper bound.
func (c *Checker) outputLabels(expr parser.Expr) (set map[string]bool, exact bool) {
	switch n := expr.(type) {
	case *parser.VectorSelector:
		set, exact = map[string]bool{}, true
		for _, se := range c.selected(n) {
			for l := range se.Labels {
				set[l] = true
			}
			exact = exact && !se.Recorded
		}
		return set, exact
	case *parser.MatrixSelector:
		return c.outputLabels(n.VectorSelector)
	case *parser.SubqueryExpr:
		return c.outputLabels(n.Expr)
	case *parser.ParenExpr:
		return c.outputLabels(n.Expr)
	case *parser.UnaryExpr:
		return c.outputLabels(n.Expr)
	case *parser.StepInvariantExpr:
		return c.outputLabels(n.Expr)
	case *parser.AggregateExpr:
		inner, exact := c.outputLabels(n.Expr)
		switch {
		case n.Op == parser.TOPK || n.Op == parser.BOTTOMK || n.Op == parser.LIMITK || n.Op == parser.LIMIT_RATIO:
			return inner, exact
		case n.Without:
			for _, l := range n.Grouping {
				delete(inner, l)
			}
			return inner, exact
		}
		set = map[string]bool{}
		for _, l := range n.Grouping {
			set[l] = true
		}
		if n.Op == parser.COUNT_VALUES {
			if s, ok := unparen(n.Param).(*parser.StringLiteral); ok {
				set[s.Val] = true
			}
		}
		return set, true
	case *parser.BinaryExpr:
		lhs, lexact := c.outputLabels(n.LHS)
		rhs, rexact := c.outputLabels(n.RHS)
		lvec := n.LHS.Type() == parser.ValueTypeVector
		rvec := n.RHS.Type() == parser.ValueTypeVector
		switch {
		case lvec && !rvec:
			return lhs, lexact
		case rvec && !lvec:
			return rhs, rexact
		case !lvec && !rvec:
			return map[string]bool{}, true
		}
		if n.Op == parser.LOR {
			for l := range rhs {
				lhs[l] = true
			}
			return lhs, lexact && rexact
		}
		vm := n.VectorMatching
		if vm != nil && vm.Card == parser.CardOneToOne && !n.Op.IsSetOperator() {
			if vm.On {
				set = map[string]bool{}
				for _, l := range vm.MatchingLabels {
					if lhs[l] {
						set[l] = true
					}
				}
				return set, lexact
			}
			for _, l := range vm.MatchingLabels {
				delete(lhs, l)
			}
			return lhs, lexact
		}
		if vm != nil {
			for _, l := range vm.Include {
				lhs[l] = true
			}
		}
		return lhs, lexact && rexact
	case *parser.Call:
		switch n.Func.Name {
		case "vector", "time", "scalar", "pi":
			return map[string]bool{}, true
		case "histogram_quantile":
			set, exact = c.outputLabels(n.Args[1])
			delete(set, "le")
			return set, exact
		case "label_replace", "label_join":
			set, exact = c.outputLabels(n.Args[0])
			if s, ok := unparen(n.Args[1]).(*parser.StringLiteral); ok {
				set[s.Val] = true
			}
			return set, exact
		case "absent", "absent_over_time":
			return map[string]bool{}, false
		}
		for _, a := range n.Args {
			if t := a.Type(); t == parser.ValueTypeVector || t == parser.ValueTypeMatrix {
				return c.outputLabels(a)
			}
		}
		return map[string]bool{}, true
	}
	return map[string]bool{}, false
}

// selectors returns the vector selectors under node.
func selectors(node parser.Node) []*parser.VectorSelector {
	var out []*parser.VectorSelector
	parser.Inspect(node, func(n parser.Node, _ []parser.Node) error {
		if vs, ok := n.(*parser.VectorSelector); ok {
			out = append(out, vs)
		}
		return nil
	})
	return out
}

func unparen(e parser.Expr) parser.Expr {
	for {
		p, ok := e.(*parser.ParenExpr)
		if !ok {
			return e
		}
		e = p.Expr
	}
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

func names(sel map[string]*Series) string {
	out := make([]string, 0, len(sel))
	for n := range sel {
		out = append(out, n)
	}
	sort.Strings(out)
	return strings.Join(out, ", ")
}

func labelsOf(sel map[string]*Series) string {
	set := map[string]bool{}
	for _, se := range sel {
		for l := range se.Labels {
			set[l] = true
		}
	}
	out := make([]string, 0, len(set))
	for l := range set {
		out = append(out, l)
	}
	sort.Strings(out)
	return strings.Join(out, ", ")
}
