package mixintest_test

import (
	"bytes"
	"errors"
	"testing"

	"github.com/grafana/grafana-foundation-sdk/go/cog"
	"github.com/grafana/grafana-foundation-sdk/go/cog/plugins"
	"github.com/grafana/grafana-foundation-sdk/go/dashboard"
)

// strictDecode decodes data as Grafana's dashboard schema does (through the
// Grafana Foundation SDK's generated types and panel plugins): a missing
// required field, a field of the wrong type or an unknown field is an error.
func strictDecode(data []byte) error {
	plugins.RegisterDefaultPlugins()
	//lint:ignore SA1019 dashboard.json is a classic (v1) dashboard, what Grafana imports and exports; v2 is another format
	var d dashboard.Dashboard
	err := d.UnmarshalJSONStrict(data)
	// UnmarshalJSONStrict returns its error list even when it is empty.
	if be := (cog.BuildErrors)(nil); errors.As(err, &be) && len(be) == 0 {
		err = nil
	}
	if err != nil {
		return err
	}
	return d.Validate()
}

func TestDashboardFollowsGrafanaSchema(t *testing.T) {
	data := readFile(t, "dashboard.json")
	if err := strictDecode(data); err != nil {
		t.Fatalf("dashboard.json does not decode strictly as a Grafana dashboard:\n%v", err)
	}
	// The strict decoding does catch a mistake.
	bad := bytes.Replace(data, []byte(`"refresh": "30s"`), []byte(`"refresh": "30s", "refresh_rate": 30`), 1)
	if err := strictDecode(bad); err == nil {
		t.Error("an unknown dashboard field passed the strict decoding")
	}
	bad = bytes.Replace(data, []byte(`"wideLayout": true`), []byte(`"wideLayout": "yes"`), 1)
	if err := strictDecode(bad); err == nil {
		t.Error("a stat option of the wrong type passed the strict decoding")
	}
}
