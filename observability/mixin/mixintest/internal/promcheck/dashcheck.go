package promcheck

import (
	"encoding/json"
	"fmt"
	"regexp"
	"sort"
	"strings"

	"github.com/prometheus/prometheus/promql/parser"
)

// The parts of a Grafana dashboard the checker reads, decoded from the file
// as Grafana would read it (not from the generator's types).
type (
	gDashboard struct {
		Title         string `json:"title"`
		UID           string `json:"uid"`
		SchemaVersion int    `json:"schemaVersion"`
		Templating    struct {
			List []gVariable `json:"list"`
		} `json:"templating"`
		Panels []gPanel `json:"panels"`
	}
	gVariable struct {
		Name       string          `json:"name"`
		Type       string          `json:"type"`
		Query      json.RawMessage `json:"query"`
		Definition string          `json:"definition"`
		Datasource json.RawMessage `json:"datasource"`
		IncludeAll bool            `json:"includeAll"`
		AllValue   string          `json:"allValue"`
	}
	gPanel struct {
		ID         int             `json:"id"`
		Title      string          `json:"title"`
		Type       string          `json:"type"`
		Datasource json.RawMessage `json:"datasource"`
		GridPos    *struct {
			H, W, X, Y int
		} `json:"gridPos"`
		Targets []gTarget `json:"targets"`
		Panels  []gPanel  `json:"panels"`
	}
	gTarget struct {
		Expr         string          `json:"expr"`
		LegendFormat string          `json:"legendFormat"`
		RefID        string          `json:"refId"`
		Datasource   json.RawMessage `json:"datasource"`
	}
	gDatasource struct {
		Type string `json:"type"`
		UID  string `json:"uid"`
	}
)

// builtinVars are Grafana's own variables with a value that parses where
// they are used (a range, a number of seconds).
var builtinVars = map[string]string{
	"__rate_interval": "5m",
	"__interval":      "1m",
	"__interval_ms":   "60000",
	"__range":         "1h",
	"__range_s":       "3600",
	"__range_ms":      "3600000",
}

// varRef matches $name, ${name}, ${name:format} and [[name]].
var varRef = regexp.MustCompile(`\$\{(\w+)(?::[^}]*)?\}|\$(\w+)|\[\[(\w+)(?::[^\]]*)?\]\]`)

// labelValuesQuery matches a Prometheus variable query label_values(selector, label).
var labelValuesQuery = regexp.MustCompile(`^\s*label_values\(\s*(.+?)\s*,\s*(\w+)\s*\)\s*$`)

// CheckDashboard checks a Grafana dashboard's JSON: that it has a title,
// a uid and a datasource variable of type prometheus; that every query
// variable is a label_values() of an exported series and label; that every
// panel has a title and a grid position, and every non-row panel the
// datasource of that variable and at least one target; and that every
// target's expression passes CheckExpr, once with each variable set to a
// value the registry has and once with its "All" value, and names only
// labels its result has in its legend.
func (c *Checker) CheckDashboard(data []byte) []error {
	var d gDashboard
	if err := json.Unmarshal(data, &d); err != nil {
		return []error{fmt.Errorf("dashboard JSON: %w", err)}
	}
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if d.Title == "" {
		bad("dashboard: no title")
	}
	if d.UID == "" {
		bad("dashboard: no uid")
	}
	if d.SchemaVersion < 36 {
		bad("dashboard: schemaVersion %d, want at least 36 (data sources referenced by uid)", d.SchemaVersion)
	}

	// Variables: two substitutions, one with real values, one with the
	// "All" values.
	real := map[string]string{}
	all := map[string]string{}
	dsVar := false
	for _, v := range d.Templating.List {
		switch v.Type {
		case "datasource":
			var q string
			if json.Unmarshal(v.Query, &q) != nil || q != "prometheus" {
				bad("variable %s: a datasource variable of type %s, want prometheus", v.Name, v.Query)
			}
			if v.Name == "datasource" {
				dsVar = true
			}
			real[v.Name], all[v.Name] = "prom", "prom"
		case "query":
			val, err := c.checkVariable(v)
			if err != nil {
				bad("variable %s: %v", v.Name, err)
				continue
			}
			real[v.Name], all[v.Name] = val, val
			if v.IncludeAll && v.AllValue != "" {
				all[v.Name] = v.AllValue
			}
		default:
			bad("variable %s: type %q is not checked", v.Name, v.Type)
		}
	}
	if !dsVar {
		bad("dashboard: no datasource variable named datasource")
	}

	ids := map[int]string{}
	var grid [][24]string
	var walk func(panels []gPanel, nested bool)
	walk = func(panels []gPanel, nested bool) {
		for _, p := range panels {
			name := fmt.Sprintf("panel %d %q", p.ID, p.Title)
			if p.Title == "" {
				bad("%s: no title", name)
			}
			if prev, ok := ids[p.ID]; ok {
				bad("%s: id %d is also panel %q", name, p.ID, prev)
			}
			ids[p.ID] = p.Title
			if g := p.GridPos; g == nil || g.W <= 0 || g.H <= 0 || g.X < 0 || g.Y < 0 || g.X+g.W > 24 {
				bad("%s: no grid position within the 24 columns", name)
			} else if !nested {
				for y := g.Y; y < g.Y+g.H; y++ {
					for len(grid) <= y {
						grid = append(grid, [24]string{})
					}
					for x := g.X; x < g.X+g.W; x++ {
						if other := grid[y][x]; other != "" {
							bad("%s: overlaps panel %s", name, other)
							y = g.Y + g.H
							break
						}
						grid[y][x] = fmt.Sprintf("%q", p.Title)
					}
				}
			}
			if p.Type == "row" {
				if len(p.Targets) > 0 {
					bad("%s: a row with targets", name)
				}
				walk(p.Panels, true)
				continue
			}
			if err := checkDatasource(p.Datasource, false); err != nil {
				bad("%s: %v", name, err)
			}
			if len(p.Targets) == 0 {
				bad("%s: no targets", name)
			}
			refs := map[string]bool{}
			for _, t := range p.Targets {
				tname := fmt.Sprintf("%s target %s", name, t.RefID)
				if t.RefID == "" || refs[t.RefID] {
					bad("%s: missing or repeated refId", tname)
				}
				refs[t.RefID] = true
				if err := checkDatasource(t.Datasource, true); err != nil {
					bad("%s: %v", tname, err)
				}
				if strings.TrimSpace(t.Expr) == "" {
					bad("%s: no expr", tname)
					continue
				}
				for _, vars := range []map[string]string{real, all} {
					expr, err := substitute(t.Expr, vars)
					if err != nil {
						bad("%s: %v", tname, err)
						break
					}
					for _, err := range c.CheckExpr(expr) {
						bad("%s: %s: %v", tname, expr, err)
					}
				}
				if expr, err := substitute(t.Expr, real); err == nil {
					if err := c.checkLegend(expr, t.LegendFormat); err != nil {
						bad("%s: %v", tname, err)
					}
				}
			}
		}
	}
	walk(d.Panels, false)
	return errs
}

// checkVariable checks a query variable and returns a value the registry
// has for it.
func (c *Checker) checkVariable(v gVariable) (string, error) {
	if err := checkDatasource(v.Datasource, false); err != nil {
		return "", err
	}
	var q string
	if err := json.Unmarshal(v.Query, &q); err != nil {
		var obj struct{ Query string }
		if err := json.Unmarshal(v.Query, &obj); err != nil {
			return "", fmt.Errorf("query %s: neither a string nor an object with a query", v.Query)
		}
		q = obj.Query
	}
	if v.Definition != "" && v.Definition != q {
		return "", fmt.Errorf("definition %q is not the query %q", v.Definition, q)
	}
	m := labelValuesQuery.FindStringSubmatch(q)
	if m == nil {
		return "", fmt.Errorf("query %q: want label_values(selector, label)", q)
	}
	expr, err := c.parser.ParseExpr(m[1])
	if err != nil {
		return "", fmt.Errorf("query %q: %w", q, err)
	}
	vs, ok := expr.(*parser.VectorSelector)
	if !ok {
		return "", fmt.Errorf("query %q: %s is not a series selector", q, m[1])
	}
	if errs := c.checkSelector(vs); len(errs) > 0 {
		return "", fmt.Errorf("query %q: %w", q, errs[0])
	}
	values := map[string]bool{}
	for _, se := range c.selected(vs) {
		for val := range se.Labels[m[2]] {
			values[val] = true
		}
	}
	if len(values) == 0 {
		return "", fmt.Errorf("query %q: the registry has no series with label %s there", q, m[2])
	}
	sorted := make([]string, 0, len(values))
	for val := range values {
		sorted = append(sorted, val)
	}
	sort.Strings(sorted)
	// Grafana escapes a multi-value variable's value for a regular
	// expression inside a PromQL string.
	return strings.ReplaceAll(regexp.QuoteMeta(sorted[0]), `\`, `\\`), nil
}

// checkDatasource checks that raw refers to the datasource variable; an
// absent one is accepted where the panel's applies (a target).
func checkDatasource(raw json.RawMessage, optional bool) error {
	if len(raw) == 0 || string(raw) == "null" {
		if optional {
			return nil
		}
		return fmt.Errorf("no datasource; want the datasource variable")
	}
	var ds gDatasource
	if err := json.Unmarshal(raw, &ds); err != nil {
		return fmt.Errorf("datasource %s: want {\"type\": \"prometheus\", \"uid\": \"${datasource}\"}", raw)
	}
	if ds.Type != "prometheus" || (ds.UID != "${datasource}" && ds.UID != "$datasource") {
		return fmt.Errorf("datasource %s: want {\"type\": \"prometheus\", \"uid\": \"${datasource}\"}", raw)
	}
	return nil
}

// substitute replaces Grafana variables in expr by vars and the builtins.
func substitute(expr string, vars map[string]string) (string, error) {
	var undefined []string
	out := varRef.ReplaceAllStringFunc(expr, func(ref string) string {
		m := varRef.FindStringSubmatch(ref)
		name := m[1] + m[2] + m[3]
		if v, ok := vars[name]; ok {
			return v
		}
		if v, ok := builtinVars[name]; ok {
			return v
		}
		undefined = append(undefined, name)
		return ref
	})
	if len(undefined) > 0 {
		return "", fmt.Errorf("undefined variable $%s", strings.Join(undefined, ", $"))
	}
	return out, nil
}

// legendRef matches {{label}} in a legend format.
var legendRef = regexp.MustCompile(`\{\{\s*(\w+)\s*\}\}`)

// checkLegend checks that every label of legend is on the result of expr.
func (c *Checker) checkLegend(expr, legend string) error {
	refs := legendRef.FindAllStringSubmatch(legend, -1)
	if len(refs) == 0 {
		return nil
	}
	root, err := c.parser.ParseExpr(expr)
	if err != nil {
		return nil // reported by CheckExpr
	}
	have, exact := c.outputLabels(root)
	if !exact {
		return nil
	}
	for _, r := range refs {
		if !have[r[1]] {
			return fmt.Errorf("legend %q: the result has no label %s", legend, r[1])
		}
	}
	return nil
}
