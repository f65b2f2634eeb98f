package metricname_test

import (
	"testing"

	"github.com/idemkit/idempotency/internal/metricname"
)

func TestCheckNamespace(t *testing.T) {
	for ns, ok := range map[string]bool{
		"": true, "shop": true, "Shop_2": true, "_x": true,
		"my-app": false, "2fast": false, "shop:api": false, "é": false, " shop": false,
	} {
		err := metricname.CheckNamespace(ns)
		if (err == nil) != ok {
			t.Errorf("CheckNamespace(%q) = %v, want ok %v", ns, err, ok)
		}
	}
	want := `"my-app" is not a Prometheus name; use letters, digits and underscores, not starting with a digit`
	if err := metricname.CheckNamespace("my-app"); err == nil || err.Error() != want {
		t.Errorf("CheckNamespace(my-app) = %v, want %s", err, want)
	}
}
