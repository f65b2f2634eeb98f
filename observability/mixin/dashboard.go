package mixin

import (
	"bytes"
	"encoding/json"
	"fmt"
	"regexp"

	"github.com/idemkit/idempotency/internal/metricname"
)

// DashboardUID is the uid of the generated dashboard; importing it again
// replaces the earlier import instead of adding a copy.
const DashboardUID = "idemkit-idempotency"

// The JSON model of the part of a Grafana dashboard this package writes. The
// field order is the order Grafana exports them in, so that a diff against an
// export of the imported dashboard stays small.
type (
	dashboard struct {
		Annotations   annotations `json:"annotations"`
		Description   string      `json:"description"`
		Editable      bool        `json:"editable"`
		GraphTooltip  int         `json:"graphTooltip"`
		Links         []any       `json:"links"`
		Panels        []panel     `json:"panels"`
		Refresh       string      `json:"refresh"`
		SchemaVersion int         `json:"schemaVersion"`
		Tags          []string    `json:"tags"`
		Templating    templating  `json:"templating"`
		Time          timeRange   `json:"time"`
		Timezone      string      `json:"timezone"`
		Title         string      `json:"title"`
		UID           string      `json:"uid"`
		Version       int         `json:"version"`
	}
	annotations struct {
		List []annotation `json:"list"`
	}
	annotation struct {
		BuiltIn    int        `json:"builtIn"`
		Datasource datasource `json:"datasource"`
		Enable     bool       `json:"enable"`
		Hide       bool       `json:"hide"`
		IconColor  string     `json:"iconColor"`
		Name       string     `json:"name"`
		Type       string     `json:"type"`
	}
	datasource struct {
		Type string `json:"type"`
		UID  string `json:"uid"`
	}
	templating struct {
		List []variable `json:"list"`
	}
	variable struct {
		AllValue    string      `json:"allValue,omitempty"`
		Datasource  *datasource `json:"datasource,omitempty"`
		Definition  string      `json:"definition,omitempty"`
		Description string      `json:"description"`
		Hide        int         `json:"hide"`
		IncludeAll  bool        `json:"includeAll"`
		Label       string      `json:"label"`
		Multi       bool        `json:"multi"`
		Name        string      `json:"name"`
		Options     []any       `json:"options"`
		Query       string      `json:"query"`
		Refresh     int         `json:"refresh"`
		Regex       string      `json:"regex"`
		Sort        int         `json:"sort,omitempty"`
		Type        string      `json:"type"`
	}
	timeRange struct {
		From string `json:"from"`
		To   string `json:"to"`
	}
	panel struct {
		Collapsed   *bool        `json:"collapsed,omitempty"`
		Datasource  datasource   `json:"datasource"`
		Description string       `json:"description,omitempty"`
		FieldConfig *fieldConfig `json:"fieldConfig,omitempty"`
		GridPos     gridPos      `json:"gridPos"`
		ID          int          `json:"id"`
		Options     any          `json:"options,omitempty"`
		Panels      *[]panel     `json:"panels,omitempty"` // a row's; [] when it is not collapsed
		Targets     []target     `json:"targets,omitempty"`
		Title       string       `json:"title"`
		Type        string       `json:"type"`
	}
	fieldConfig struct {
		Defaults  fieldDefaults `json:"defaults"`
		Overrides []any         `json:"overrides"`
	}
	fieldDefaults struct {
		Custom     map[string]any `json:"custom,omitempty"`
		Decimals   *int           `json:"decimals,omitempty"`
		Max        *float64       `json:"max,omitempty"`
		Min        *float64       `json:"min,omitempty"`
		Thresholds *thresholds    `json:"thresholds,omitempty"`
		Unit       string         `json:"unit"`
	}
	thresholds struct {
		Mode  string `json:"mode"`
		Steps []step `json:"steps"`
	}
	step struct {
		Color string   `json:"color"`
		Value *float64 `json:"value"`
	}
	gridPos struct {
		H int `json:"h"`
		W int `json:"w"`
		X int `json:"x"`
		Y int `json:"y"`
	}
	target struct {
		Datasource   datasource `json:"datasource"`
		EditorMode   string     `json:"editorMode"`
		Expr         string     `json:"expr"`
		Instant      bool       `json:"instant,omitempty"`
		LegendFormat string     `json:"legendFormat"`
		Range        bool       `json:"range"`
		RefID        string     `json:"refId"`
	}
)

// promDS is the datasource of every panel, target and query variable: the
// data source the user picks in the datasource variable.
var promDS = datasource{Type: "prometheus", UID: "${datasource}"}

// spec is one panel of the layout below, before ids and positions.
type spec struct {
	title, description string
	kind               string // "timeseries" or "stat"; "row" starts a row
	unit               string
	w, h               int
	ratio              bool // values between 0 and 1
	alarm              bool // a stat that turns red above 0
	queries            []query
}

type query struct{ expr, legend string }

// Shorthands for the selectors of the layout. $operation and $method are
// the dashboard's variables, $__rate_interval and $__range Grafana's.
const (
	ops  = `operation=~"$operation"`
	meth = `method=~"$method"`
	ri   = `[$__rate_interval]`
	rng  = `[$__range]`
)

// layout is the dashboard: rows of panels, left to right.
var layout = []spec{
	{kind: "row", title: "Overview (selected time range)"},
	{kind: "stat", title: "Hit ratio", ratio: true, unit: "percentunit",
		description: "Replays among hits and misses over the time range: hit / (hit + miss). Collisions (in_flight) are not in it.",
		queries:     []query{{expr: `sum(increase(idempotency_requests_total{` + ops + `, outcome="hit"}` + rng + `)) / sum(increase(idempotency_requests_total{` + ops + `, outcome=~"hit|miss"}` + rng + `))`}}},
	{kind: "stat", title: "Unprotected runs", alarm: true, unit: "short",
		description: "Actions run without idempotency protection over the time range: the store failed in on-storage-error mode run, or a request had no key (method none).",
		queries:     []query{{expr: `sum(increase(idempotency_unprotected_total{` + ops + `}` + rng + `)) or vector(0)`}}},
	{kind: "stat", title: "Storage errors", alarm: true, unit: "short",
		description: "Store calls that failed or timed out over the time range, all methods.",
		queries:     []query{{expr: `sum(increase(idempotency_storage_duration_seconds_count{result=~"error|timeout"}` + rng + `)) or vector(0)`}}},
	{kind: "stat", title: "Lease lost", alarm: true, unit: "short",
		description: "Reservations found owned by another caller or gone: another caller may have run the action too.",
		queries:     []query{{expr: `sum(increase(idempotency_errors_total{` + ops + `, error_type="lease_lost"}` + rng + `)) or vector(0)`}}},
	{kind: "stat", title: "Wait timeouts", alarm: true, unit: "short",
		description: "Callers that stopped waiting for another caller's result at the wait bound (ErrInProgress, HTTP 409).",
		queries:     []query{{expr: `sum(increase(idempotency_wait_duration_seconds_count{` + ops + `, outcome="timeout"}` + rng + `)) or vector(0)`}}},
	{kind: "stat", title: "Operation label overflow", alarm: true, unit: "short",
		description: "Events counted under operation=\"~other\" because the operation label limit was reached: an operation name is probably built from request data.",
		queries:     []query{{expr: `sum(increase(idempotency_requests_total{operation="~other"}` + rng + `)) or vector(0)`}}},

	{kind: "row", title: "Requests"},
	{title: "Request outcomes by operation", unit: "reqps", w: 12,
		description: "Outcomes of looking a key up: hit (replayed), miss (the action runs), in_flight (another caller held the key). A waiting caller counts in_flight and then hit or miss.",
		queries:     []query{{expr: `sum by (operation, outcome) (rate(idempotency_requests_total{` + ops + `}` + ri + `))`, legend: "{{operation}} {{outcome}}"}}},
	{title: "Hit ratio by operation", unit: "percentunit", w: 12, ratio: true,
		description: "hit / (hit + miss) per operation: the share of calls answered from a stored result.",
		queries:     []query{{expr: `sum by (operation) (rate(idempotency_requests_total{` + ops + `, outcome="hit"}` + ri + `)) / sum by (operation) (rate(idempotency_requests_total{` + ops + `, outcome=~"hit|miss"}` + ri + `))`, legend: "{{operation}}"}}},
	{title: "Stored results by operation", unit: "ops", w: 12,
		description: "Action results stored for replay.",
		queries:     []query{{expr: `sum by (operation) (rate(idempotency_stored_total{` + ops + `}` + ri + `))`, legend: "{{operation}}"}}},
	{title: "Unprotected runs by operation and method", unit: "ops", w: 12,
		description: "Actions run without protection. method is the store call that failed (on-storage-error mode run), or none when the request had no key.",
		queries:     []query{{expr: `sum by (operation, method) (rate(idempotency_unprotected_total{` + ops + `}` + ri + `))`, legend: "{{operation}} {{method}}"}}},

	{kind: "row", title: "Errors"},
	{title: "Errors by type", unit: "ops", w: 12,
		description: "Errors the coordinator reported, by error_type. storage_* are store failures by what the coordinator was doing; key_reuse is a client bug.",
		queries:     []query{{expr: `sum by (error_type) (rate(idempotency_errors_total{` + ops + `}` + ri + `))`, legend: "{{error_type}}"}}},
	{title: "Lease lost by operation", unit: "short", w: 12,
		description: "lease_lost errors per operation in each interval: the action outlived its lease, or Redis failed over or evicted the key.",
		queries:     []query{{expr: `sum by (operation) (increase(idempotency_errors_total{` + ops + `, error_type="lease_lost"}` + ri + `))`, legend: "{{operation}}"}}},

	{kind: "row", title: "Storage"},
	{title: "Storage latency (successful calls)", unit: "s", w: 12,
		description: "p50 and p99 of store calls that succeeded, by method, from idempotency_storage_duration_seconds. A healthy Redis answers in well under a millisecond.",
		queries: []query{
			{expr: `histogram_quantile(0.5, sum by (le, method) (rate(idempotency_storage_duration_seconds_bucket{` + meth + `, result="ok"}` + ri + `)))`, legend: "p50 {{method}}"},
			{expr: `histogram_quantile(0.99, sum by (le, method) (rate(idempotency_storage_duration_seconds_bucket{` + meth + `, result="ok"}` + ri + `)))`, legend: "p99 {{method}}"},
		}},
	{title: "Storage errors by method and result", unit: "ops", w: 12,
		description: "Store calls that did not succeed: error, timeout (a deadline or a network timeout) or canceled (mostly a caller that went away, not the store's fault).",
		queries:     []query{{expr: `sum by (method, result) (rate(idempotency_storage_duration_seconds_count{` + meth + `, result!="ok"}` + ri + `))`, legend: "{{method}} {{result}}"}}},
	{title: "Storage error ratio by method", unit: "percentunit", w: 12, ratio: true,
		description: "Share of store calls that failed or timed out, by method.",
		queries:     []query{{expr: `sum by (method) (rate(idempotency_storage_duration_seconds_count{` + meth + `, result=~"error|timeout"}` + ri + `)) / sum by (method) (rate(idempotency_storage_duration_seconds_count{` + meth + `}` + ri + `))`, legend: "{{method}}"}}},
	{title: "Storage calls by method", unit: "ops", w: 12,
		description: "All store calls per second, by method.",
		queries:     []query{{expr: `sum by (method) (rate(idempotency_storage_duration_seconds_count{` + meth + `}` + ri + `))`, legend: "{{method}}"}}},

	{kind: "row", title: "Waits"},
	{title: "Wait outcomes", unit: "ops", w: 12,
		description: "How waits for another caller's result ended: hit, takeover, timeout, canceled, error, key_reuse.",
		queries:     []query{{expr: `sum by (operation, outcome) (rate(idempotency_wait_duration_seconds_count{` + ops + `}` + ri + `))`, legend: "{{operation}} {{outcome}}"}}},
	{title: "Wait duration", unit: "s", w: 12,
		description: "p50 and p99 of the time callers waited, all outcomes; roughly the running action's remaining time.",
		queries: []query{
			{expr: `histogram_quantile(0.5, sum by (le, operation) (rate(idempotency_wait_duration_seconds_bucket{` + ops + `}` + ri + `)))`, legend: "p50 {{operation}}"},
			{expr: `histogram_quantile(0.99, sum by (le, operation) (rate(idempotency_wait_duration_seconds_bucket{` + ops + `}` + ri + `)))`, legend: "p99 {{operation}}"},
		}},

	{kind: "row", title: "Consumers"},
	{title: "Consumer deliveries by decision", unit: "ops", w: 12,
		description: "Deliveries queue consumers processed, by decision (ack, retry, dead_letter) and reason. in_progress, storage_error and canceled retries are not failures.",
		queries:     []query{{expr: `sum by (operation, decision, reason) (rate(idempotency_consumer_deliveries_total{` + ops + `}` + ri + `))`, legend: "{{operation}} {{decision}} {{reason}}"}}},
	{title: "Consumer dead letters", unit: "short", w: 12,
		description: "Messages dead-lettered in each interval, by reason: they wait in the dead-letter stream.",
		queries:     []query{{expr: `sum by (operation, reason) (increase(idempotency_consumer_dead_letters_total{` + ops + `}` + ri + `))`, legend: "{{operation}} {{reason}}"}}},
	{title: "Consumer command errors", unit: "ops", w: 12,
		description: "Broker commands of queue consumers that failed, by command (xreadgroup, xclaim, xack, xadd, ...).",
		queries:     []query{{expr: `sum by (operation, command) (rate(idempotency_consumer_errors_total{` + ops + `}` + ri + `))`, legend: "{{operation}} {{command}}"}}},
	{title: "Consumer claims", unit: "ops", w: 12,
		description: "Messages claimed from consumers that left them pending (a dead consumer, or a Retry): redeliveries.",
		queries:     []query{{expr: `sum by (operation) (rate(idempotency_consumer_claims_total{` + ops + `}` + ri + `))`, legend: "{{operation}}"}}},
}

// metricRef finds the library's metric names in an expression: idempotency_
// at the start of a name.
var metricRef = regexp.MustCompile(`(^|[^A-Za-z0-9_:])(idempotency_)`)

// Dashboard returns the Grafana dashboard as indented JSON. namespace is the
// metric name prefix the application set with observability.WithNamespace:
// "" for the names without one (the committed dashboard.json), "shop" for
// shop_idempotency_requests_total and so on.
func Dashboard(namespace string) ([]byte, error) {
	if err := metricname.CheckNamespace(namespace); err != nil {
		return nil, fmt.Errorf("mixin: %w", err)
	}
	prefix := func(s string) string {
		if namespace == "" {
			return s
		}
		return metricRef.ReplaceAllString(s, "${1}"+namespace+"_${2}")
	}
	title := "Idempotency"
	uid := DashboardUID
	if namespace != "" {
		title += " (" + namespace + ")"
		uid += "-" + namespace
	}
	d := dashboard{
		Annotations: annotations{List: []annotation{{
			BuiltIn: 1, Datasource: datasource{Type: "grafana", UID: "-- Grafana --"},
			Enable: true, Hide: true, IconColor: "rgba(0, 211, 255, 1)",
			Name: "Annotations & Alerts", Type: "dashboard",
		}}},
		Description:   "idemkit: request outcomes, unprotected runs, errors, store latency and waits of github.com/idemkit/idempotency. Generated by observability/mixin; see its README.",
		Editable:      true,
		GraphTooltip:  1,
		Links:         []any{},
		Refresh:       "30s",
		SchemaVersion: 39,
		Tags:          []string{"idempotency", "idemkit"},
		Time:          timeRange{From: "now-6h", To: "now"},
		Timezone:      "browser",
		Title:         title,
		UID:           uid,
		Version:       1,
	}
	d.Templating.List = []variable{
		{Name: "datasource", Label: "Data source", Type: "datasource", Query: "prometheus",
			Description: "The Prometheus that scrapes the application.", Options: []any{}, Refresh: 1},
		{Name: "operation", Label: "Operation", Type: "query", Datasource: &promDS,
			Query: prefix("label_values(idempotency_requests_total, operation)"), Definition: prefix("label_values(idempotency_requests_total, operation)"),
			Description: "The operation label: the operation names of the coordinator's calls (~other: past the operation limit).",
			Multi:       true, IncludeAll: true, AllValue: ".*", Options: []any{}, Refresh: 2, Sort: 1},
		{Name: "method", Label: "Store method", Type: "query", Datasource: &promDS,
			Query: prefix("label_values(idempotency_storage_duration_seconds_count, method)"), Definition: prefix("label_values(idempotency_storage_duration_seconds_count, method)"),
			Description: "The store method of the storage panels.",
			Multi:       true, IncludeAll: true, AllValue: ".*", Options: []any{}, Refresh: 2, Sort: 1},
	}

	id, x, y, rowH := 0, 0, 0, 0
	for _, s := range layout {
		id++
		if s.kind == "row" {
			if x > 0 {
				y += rowH
			}
			collapsed := false
			d.Panels = append(d.Panels, panel{Collapsed: &collapsed, Datasource: promDS, GridPos: gridPos{H: 1, W: 24, X: 0, Y: y}, ID: id, Panels: &[]panel{}, Title: s.title, Type: "row"})
			x, y, rowH = 0, y+1, 0
			continue
		}
		kind, w, h := s.kind, s.w, s.h
		if kind == "" {
			kind = "timeseries"
		}
		if w == 0 {
			w = 4
		}
		if h == 0 {
			h = 8
			if kind == "stat" {
				h = 4
			}
		}
		if x+w > 24 {
			x, y, rowH = 0, y+rowH, 0
		}
		p := panel{Datasource: promDS, Description: s.description, GridPos: gridPos{H: h, W: w, X: x, Y: y}, ID: id, Title: s.title, Type: kind}
		p.FieldConfig, p.Options = panelStyle(kind, s)
		for i, q := range s.queries {
			t := target{Datasource: promDS, EditorMode: "code", Expr: prefix(q.expr), LegendFormat: q.legend, Range: true, RefID: string(rune('A' + i))}
			if kind == "stat" {
				t.Instant, t.Range, t.LegendFormat = true, false, "__auto"
			}
			p.Targets = append(p.Targets, t)
		}
		d.Panels = append(d.Panels, p)
		x += w
		rowH = max(rowH, h)
	}

	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	if err := enc.Encode(d); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// panelStyle returns the field config and options of a panel of kind.
func panelStyle(kind string, s spec) (*fieldConfig, any) {
	fc := &fieldConfig{Defaults: fieldDefaults{Unit: s.unit}, Overrides: []any{}}
	if s.ratio {
		zero, one := 0.0, 1.0
		fc.Defaults.Min, fc.Defaults.Max = &zero, &one
	}
	if kind == "stat" {
		green := step{Color: "green"}
		if s.alarm {
			one := 1.0
			fc.Defaults.Thresholds = &thresholds{Mode: "absolute", Steps: []step{green, {Color: "red", Value: &one}}}
		} else {
			fc.Defaults.Thresholds = &thresholds{Mode: "absolute", Steps: []step{{Color: "text"}}}
		}
		return fc, map[string]any{
			"colorMode":              "background",
			"graphMode":              "none",
			"justifyMode":            "auto",
			"orientation":            "auto",
			"percentChangeColorMode": "standard",
			"reduceOptions": map[string]any{
				"calcs": []string{"lastNotNull"}, "fields": "", "values": false,
			},
			"showPercentChange": false,
			"textMode":          "auto",
			"wideLayout":        true,
		}
	}
	fc.Defaults.Custom = map[string]any{
		"drawStyle":   "line",
		"fillOpacity": 10,
		"lineWidth":   1,
		"showPoints":  "never",
		"spanNulls":   false,
	}
	return fc, map[string]any{
		"legend":  map[string]any{"calcs": []string{}, "displayMode": "list", "placement": "bottom", "showLegend": true},
		"tooltip": map[string]any{"mode": "multi", "sort": "desc"},
	}
}
