package main

import (
	"flag"
	"io"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/idempg"
)

func TestParseArgs(t *testing.T) {
	for _, tc := range []struct {
		args []string
		pos  []string
		json bool
	}{
		{[]string{"op", "k1", "k2"}, []string{"op", "k1", "k2"}, false},
		{[]string{"-json", "op", "k1"}, []string{"op", "k1"}, true},
		{[]string{"op", "-json", "k1"}, []string{"op", "k1"}, true},
		{[]string{"op", "k1", "-json"}, []string{"op", "k1"}, true},
		{[]string{"op", "--", "-json", "-k"}, []string{"op", "-json", "-k"}, false},
		{[]string{"-json", "--", "--"}, []string{"--"}, true},
		{nil, nil, false},
	} {
		fs := flag.NewFlagSet("t", flag.ContinueOnError)
		asJSON := fs.Bool("json", false, "")
		pos, err := parse(fs, &overrides{}, tc.args)
		if err != nil || !slices.Equal(pos, tc.pos) || *asJSON != tc.json {
			t.Errorf("parse(%q) = %q, -json %v, %v; want %q, %v", tc.args, pos, *asJSON, err, tc.pos, tc.json)
		}
	}
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	if _, err := parse(fs, nil, []string{"op", "-nope"}); err == nil {
		t.Error("parse of an unknown flag: no error")
	}
}

func TestEncodeResult(t *testing.T) {
	for _, tc := range []struct {
		result          string
		format          string
		json            bool
		want, wantUsing string
	}{
		{`{"id":"ch_1"}`, formatAuto, false, `{"id":"ch_1"}`, "text"},
		{"héllo wörld", formatAuto, false, "héllo wörld", "text"},
		{"a\nb", formatAuto, false, `"a\nb"`, "quoted"},
		{"\x1b[31mred", formatAuto, false, `"\x1b[31mred"`, "quoted"},
		{"\u202eevil", formatAuto, false, `"\u202eevil"`, "quoted"}, // a bidi override
		{"\xff\x00", formatAuto, false, "/wA=", "base64"},
		{"\xff\x00", formatText, false, `"\xff\x00"`, "quoted"},
		{"plain", formatText, false, "plain", "text"},
		{"plain", formatHex, false, "706c61696e", "hex"},
		{"plain", formatBase64, false, "cGxhaW4=", "base64"},
		{"", formatAuto, false, "", "text"},
		{"a\nb", formatAuto, true, "a\nb", "text"},
		{"\xff\x00", formatAuto, true, "/wA=", "base64"},
		{"\xff\x00", formatText, true, "/wA=", "base64"},
		{"plain", formatHex, true, "706c61696e", "hex"},
	} {
		got, using := encodeResult([]byte(tc.result), tc.format, tc.json)
		if got != tc.want || using != tc.wantUsing {
			t.Errorf("encodeResult(%q, %s, json %v) = %q (%s), want %q (%s)", tc.result, tc.format, tc.json, got, using, tc.want, tc.wantUsing)
		}
	}
}

func TestSafe(t *testing.T) {
	for in, want := range map[string]string{
		"idempotency:op:k{1}": "idempotency:op:k{1}",
		"with space":          "with space",
		"esc\x1b[2J":          `"esc\x1b[2J"`,
		"tab\t":               `"tab\t"`,
		"é":                   `"\u00e9"`,
	} {
		if got := safe(in); got != want {
			t.Errorf("safe(%q) = %s, want %s", in, got, want)
		}
	}
}

// Every secret in Settings is masked, as Settings.Redacted masks it, and
// every other value is shown as its variable would say it.
func TestSettingValue(t *testing.T) {
	const secret = "s3cr3t-value"
	for _, tc := range []struct {
		name   string
		value  any
		masked bool
		want   string
	}{
		{"RedisURL", "redis://u:xxxxx@h:1/0", true, "redis://u:xxxxx@h:1/0"},
		{"RedisURL", "redis://h:1/0", false, "redis://h:1/0"},
		{"RedisSentinelPassword", "xxxxx", true, "xxxxx"},
		{"RedisSentinelPassword", "", false, `""`},
		{"KeyPrefix", "", false, `""`},
		{"KeyPrefix", "idempotency:", false, `"idempotency:"`},
		{"RedisClusterAddrs", []string{"a:1", "b:2"}, false, "a:1,b:2"},
		{"OperationTTLS", idempotency.OperationTTLs{"b.op": time.Hour, "a.op": time.Minute}, false, "a.op:1m0s,b.op:1h0m0s"},
		{"Lease", 30 * time.Second, false, "30s"},
		{"Enabled", true, false, "true"},
		{"MaxResultBytes", 1 << 20, false, "1048576"},
	} {
		got := settingValue(tc.name, reflect.ValueOf(tc.value), tc.masked)
		if got != tc.want {
			t.Errorf("settingValue(%s, %v, %v) = %q, want %q", tc.name, tc.value, tc.masked, got, tc.want)
		}
	}

	// Whatever fields Settings gains: a field whose name speaks of a
	// password, a secret or a credential is one that Redacted must mask
	// (idemctl has no masking of its own), and the URL's password too.
	s := idempotency.DefaultSettings()
	v := reflect.ValueOf(&s).Elem()
	secrets := 0
	for i := range v.NumField() {
		f := v.Type().Field(i)
		n := strings.ToLower(f.Name)
		if !strings.Contains(n, "password") && !strings.Contains(n, "secret") && !strings.Contains(n, "credential") {
			continue
		}
		switch f.Type.Kind() {
		case reflect.String:
			v.Field(i).SetString(secret)
		case reflect.Slice:
			v.Field(i).Set(reflect.ValueOf([]string{secret}))
		default:
			t.Fatalf("Settings.%s holds a secret of a kind this test does not set: %v", f.Name, f.Type)
		}
		secrets++
	}
	if secrets == 0 {
		t.Fatal("no field of Settings holds a password: the test looks for the wrong names")
	}
	s.RedisURL = "redis://:" + secret + "@localhost:6379/0"
	pg := idempg.Settings{URL: "postgres://app:" + secret + "@db/shop"}
	var out strings.Builder
	(&app{stdout: &out}).printSettings(config{Settings: s, pg: pg}, &overrides{})
	if strings.Contains(out.String(), secret[:5]) || strings.Count(out.String(), "xxxxx") != secrets+2 {
		t.Errorf("printSettings shows a secret, or does not mask %d values:\n%s", secrets+2, out.String())
	}
}

func TestOldRedis(t *testing.T) {
	for v, want := range map[string]bool{"7.0.15": false, "7.2.4": false, "8.0.0": false, "6.2.14": true, "5.0.7": true, "": false, "unknown": false} {
		if got := oldRedis(v); got != want {
			t.Errorf("oldRedis(%q) = %v, want %v", v, got, want)
		}
	}
}

func TestInfoFields(t *testing.T) {
	f := infoFields("# Server\r\nredis_version:7.0.15\r\nredis_mode:cluster\r\n\r\n# Cluster\r\ncluster_enabled:1\r\n")
	if f["redis_version"] != "7.0.15" || f["cluster_enabled"] != "1" || len(f) != 3 {
		t.Errorf("infoFields = %v", f)
	}
}
