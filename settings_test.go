package idempotency_test

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idempotency/coordinator/idemstore"

	"go.uber.org/fx"
	"go.uber.org/fx/fxtest"
	"go.uber.org/goleak"

	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/coordinator"
	"github.com/idemkit/idempotency/observability"
)

// contractDefaults is DESIGN §5 written out by hand, so that neither the
// struct tags nor DefaultSettings can drift from the documented contract.
func contractDefaults() idempotency.Settings {
	return idempotency.Settings{
		Enabled:            true,
		RedisURL:           "redis://localhost:6379/0",
		RedisAutoPipeline:  false,
		RedisCoalesceLanes: 2,
		KeyPrefix:          "idempotency:",
		RecordFormat:       2,
		DefaultTTL:         time.Hour,
		MinTTL:             time.Second,
		MaxTTL:             720 * time.Hour,
		InFlight:           "wait",
		Lease:              30 * time.Second,
		RenewInterval:      0, // lease/3
		WaitTimeout:        0, // one lease
		PollInterval:       10 * time.Millisecond,
		OnStorageError:     "run",
		StorageTimeout:     time.Second,
		BreakerFailures:    5,
		BreakerCooldown:    time.Second,
		MaxResultBytes:     1048576,
		MetricsEnabled:     true,
		TracingEnabled:     true,
		LogKeys:            "hashed",
		RedisLogs:          "zap",
	}
}

// clearEnv unsets every IDEMPOTENCY_* variable for the rest of the test (the
// developer's shell or CI may set some) and restores them afterwards. The
// test harness's own IDEMPOTENCY_TEST_* variables are left alone.
func clearEnv(t *testing.T) {
	t.Helper()
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(name, "IDEMPOTENCY_") && !strings.HasPrefix(name, "IDEMPOTENCY_TEST_") {
			t.Setenv(name, "") // registers the restore
			if err := os.Unsetenv(name); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// TestLoadSettings covers every variable of DESIGN §5 and LOG_KEYS: unset
// (the first row), valid values, the empty value, and invalid values, whose
// error must name the variable (and the accepted values of an enum).
func TestLoadSettings(t *testing.T) {
	tests := []struct {
		name string
		env  map[string]string
		// want changes contractDefaults() into the expected Settings; nil
		// expects the defaults.
		want func(s *idempotency.Settings)
		// wantErr lists substrings of the expected error; empty expects none.
		wantErr []string
	}{
		{name: "nothing set gives the documented defaults"},
		{
			name: "unrelated and unprefixed variables are not read",
			env: map[string]string{
				"IDEMPOTENCY_TEST_REQUIRE_REDIS": "1",
				"OPERATION_TTLS":                 "x:1h",
				"LEASE":                          "1ms",
				"ENABLED":                        "false",
			},
		},

		// ENABLED
		{name: "ENABLED false", env: env("ENABLED", "false"), want: func(s *idempotency.Settings) { s.Enabled = false }},
		{name: "ENABLED 0", env: env("ENABLED", "0"), want: func(s *idempotency.Settings) { s.Enabled = false }},
		{name: "ENABLED true", env: env("ENABLED", "true")},
		{name: "ENABLED not a boolean", env: env("ENABLED", "yes"), wantErr: []string{`IDEMPOTENCY_ENABLED: "yes" is not a boolean; use true or false`}},
		{name: "ENABLED empty", env: env("ENABLED", ""), wantErr: []string{`IDEMPOTENCY_ENABLED: "" is not a boolean`}},

		// REDIS_URL
		{
			name: "REDIS_URL rediss with password and db",
			env:  env("REDIS_URL", "rediss://app:secret@redis.example:6380/2"),
			want: func(s *idempotency.Settings) { s.RedisURL = "rediss://app:secret@redis.example:6380/2" },
		},
		{name: "REDIS_URL without port and db", env: env("REDIS_URL", "redis://cache"), want: func(s *idempotency.Settings) { s.RedisURL = "redis://cache" }},
		{name: "REDIS_URL with client options", env: env("REDIS_URL", "redis://cache:6379/0?dial_timeout=2s"), want: func(s *idempotency.Settings) { s.RedisURL = "redis://cache:6379/0?dial_timeout=2s" }},
		{name: "REDIS_URL http scheme", env: env("REDIS_URL", "http://cache:6379"), wantErr: []string{`IDEMPOTENCY_REDIS_URL: want a redis:// or rediss:// URL, got scheme "http"`}},
		{name: "REDIS_URL unix socket", env: env("REDIS_URL", "unix:///tmp/redis.sock"), wantErr: []string{`IDEMPOTENCY_REDIS_URL: want a redis:// or rediss:// URL, got scheme "unix"`}},
		{name: "REDIS_URL host:port without scheme", env: env("REDIS_URL", "//cache:6379"), wantErr: []string{"IDEMPOTENCY_REDIS_URL: want a redis:// or rediss:// URL, got no scheme"}},
		{name: "REDIS_URL empty means the default", env: env("REDIS_URL", "")},
		{name: "REDIS_URL bad db", env: env("REDIS_URL", "redis://cache:6379/zero"), wantErr: []string{`IDEMPOTENCY_REDIS_URL: redis: invalid database number: "zero"`}},
		{name: "REDIS_URL negative db", env: env("REDIS_URL", "redis://cache:6379/-1"), wantErr: []string{"IDEMPOTENCY_REDIS_URL: database number must not be negative, got -1"}},
		{name: "REDIS_URL unknown option", env: env("REDIS_URL", "redis://cache:6379/0?colour=blue"), wantErr: []string{"IDEMPOTENCY_REDIS_URL: redis: unexpected option: colour"}},
		{name: "REDIS_URL unparsable", env: env("REDIS_URL", "redis://[::1"), wantErr: []string{"IDEMPOTENCY_REDIS_URL: not a valid URL: missing ']' in host"}},
		{name: "REDIS_URL port out of range", env: env("REDIS_URL", "redis://cache:99999/0"), wantErr: []string{`IDEMPOTENCY_REDIS_URL: port "99999" is not a number from 1 to 65535`}},
		{name: "REDIS_URL port 0", env: env("REDIS_URL", "redis://cache:0/0"), wantErr: []string{`IDEMPOTENCY_REDIS_URL: port "0" is not a number from 1 to 65535`}},
		{name: "REDIS_URL without host", env: env("REDIS_URL", "redis://:6379/0"), wantErr: []string{"IDEMPOTENCY_REDIS_URL: want redis://host:port/db with a host, got none"}},
		{name: "REDIS_URL without host, with a password", env: env("REDIS_URL", "redis://:pw@:6379/0"), wantErr: []string{"IDEMPOTENCY_REDIS_URL: want redis://host:port/db with a host, got none"}},

		// REDIS_CLUSTER_ADDRS
		{
			name: "REDIS_CLUSTER_ADDRS two nodes",
			env:  env("REDIS_CLUSTER_ADDRS", "node-a:7000,10.0.0.2:7001,[::1]:7002"),
			want: func(s *idempotency.Settings) {
				s.RedisClusterAddrs = []string{"node-a:7000", "10.0.0.2:7001", "[::1]:7002"}
			},
		},
		{
			name: "REDIS_CLUSTER_ADDRS spaces and empty entries",
			env:  env("REDIS_CLUSTER_ADDRS", " node-a:7000 , ,node-b:7001, "),
			want: func(s *idempotency.Settings) { s.RedisClusterAddrs = []string{"node-a:7000", "node-b:7001"} },
		},
		{name: "REDIS_CLUSTER_ADDRS empty", env: env("REDIS_CLUSTER_ADDRS", "")},
		{name: "REDIS_CLUSTER_ADDRS missing port", env: env("REDIS_CLUSTER_ADDRS", "node-a:7000,node-b"), wantErr: []string{`IDEMPOTENCY_REDIS_CLUSTER_ADDRS: entry "node-b": want host:port (missing port in address)`}},
		{name: "REDIS_CLUSTER_ADDRS missing host", env: env("REDIS_CLUSTER_ADDRS", ":7000"), wantErr: []string{`IDEMPOTENCY_REDIS_CLUSTER_ADDRS: entry ":7000": want host:port with a host`}},
		{name: "REDIS_CLUSTER_ADDRS bad port", env: env("REDIS_CLUSTER_ADDRS", "node-a:http"), wantErr: []string{`IDEMPOTENCY_REDIS_CLUSTER_ADDRS: entry "node-a:http": port "http" is not a number from 1 to 65535`}},
		{name: "REDIS_CLUSTER_ADDRS port 0", env: env("REDIS_CLUSTER_ADDRS", "node-a:0"), wantErr: []string{`IDEMPOTENCY_REDIS_CLUSTER_ADDRS: entry "node-a:0": port "0"`}},

		// REDIS_SENTINEL_*
		{
			name: "REDIS_SENTINEL master and sentinels",
			env:  env("REDIS_SENTINEL_MASTER", "mymaster", "REDIS_SENTINEL_ADDRS", " sentinel-a:26379, ,10.0.0.3:26379 ", "REDIS_SENTINEL_PASSWORD", "s3cret"),
			want: func(s *idempotency.Settings) {
				s.RedisSentinelMaster, s.RedisSentinelAddrs = "mymaster", []string{"sentinel-a:26379", "10.0.0.3:26379"}
				s.RedisSentinelPassword = "s3cret"
			},
		},
		{
			name: "REDIS_SENTINEL with a database and options",
			env:  env("REDIS_SENTINEL_MASTER", "mymaster", "REDIS_SENTINEL_ADDRS", "sentinel-a:26379", "REDIS_URL", "redis://:pw@ignored:1/3?pool_size=5"),
			want: func(s *idempotency.Settings) {
				s.RedisSentinelMaster, s.RedisSentinelAddrs = "mymaster", []string{"sentinel-a:26379"}
				s.RedisURL = "redis://:pw@ignored:1/3?pool_size=5"
			},
		},
		{name: "REDIS_SENTINEL_MASTER without sentinels", env: env("REDIS_SENTINEL_MASTER", "mymaster"), wantErr: []string{"IDEMPOTENCY_REDIS_SENTINEL_ADDRS: is empty but IDEMPOTENCY_REDIS_SENTINEL_MASTER is set: list the sentinels, host:port,host:port"}},
		{name: "REDIS_SENTINEL_ADDRS without a master", env: env("REDIS_SENTINEL_ADDRS", "sentinel-a:26379"), wantErr: []string{"IDEMPOTENCY_REDIS_SENTINEL_MASTER: is empty but IDEMPOTENCY_REDIS_SENTINEL_ADDRS is set: name the master the sentinels monitor"}},
		{name: "REDIS_SENTINEL_PASSWORD without a master", env: env("REDIS_SENTINEL_PASSWORD", "s3cret"), wantErr: []string{"IDEMPOTENCY_REDIS_SENTINEL_PASSWORD: is set but IDEMPOTENCY_REDIS_SENTINEL_MASTER is not: it is the sentinels' password"}},
		{
			name:    "REDIS_SENTINEL with a cluster",
			env:     env("REDIS_SENTINEL_MASTER", "mymaster", "REDIS_SENTINEL_ADDRS", "sentinel-a:26379", "REDIS_CLUSTER_ADDRS", "node-a:7000"),
			wantErr: []string{"IDEMPOTENCY_REDIS_SENTINEL_MASTER: cannot be combined with IDEMPOTENCY_REDIS_CLUSTER_ADDRS: set one of them (a cluster fails over by itself)"},
		},
		{
			name:    "REDIS_SENTINEL_ADDRS bad entry",
			env:     env("REDIS_SENTINEL_MASTER", "mymaster", "REDIS_SENTINEL_ADDRS", "sentinel-a:26379,sentinel-b"),
			wantErr: []string{`IDEMPOTENCY_REDIS_SENTINEL_ADDRS: entry "sentinel-b": want host:port (missing port in address)`},
		},

		// REDIS_LOGS
		{name: "REDIS_LOGS off", env: env("REDIS_LOGS", "off"), want: func(s *idempotency.Settings) { s.RedisLogs = idempotency.RedisLogsOff }},
		{name: "REDIS_LOGS keep", env: env("REDIS_LOGS", "keep"), want: func(s *idempotency.Settings) { s.RedisLogs = idempotency.RedisLogsKeep }},
		{name: "REDIS_LOGS empty means zap", env: env("REDIS_LOGS", "")},
		{name: "REDIS_LOGS unknown", env: env("REDIS_LOGS", "stderr"), wantErr: []string{`IDEMPOTENCY_REDIS_LOGS: unknown go-redis log mode "stderr": accepted values are zap, off, keep`}},

		// REDIS_COALESCE_LANES
		{name: "REDIS_COALESCE_LANES 0", env: env("REDIS_COALESCE_LANES", "0"), want: func(s *idempotency.Settings) { s.RedisCoalesceLanes = 0 }},
		{name: "REDIS_COALESCE_LANES 8", env: env("REDIS_COALESCE_LANES", "8"), want: func(s *idempotency.Settings) { s.RedisCoalesceLanes = 8 }},
		// REDIS_AUTO_PIPELINE
		{name: "REDIS_AUTO_PIPELINE true", env: env("REDIS_AUTO_PIPELINE", "true"), want: func(s *idempotency.Settings) { s.RedisAutoPipeline = true }},
		{name: "REDIS_AUTO_PIPELINE 1", env: env("REDIS_AUTO_PIPELINE", "1"), want: func(s *idempotency.Settings) { s.RedisAutoPipeline = true }},
		{name: "REDIS_AUTO_PIPELINE false", env: env("REDIS_AUTO_PIPELINE", "false")},
		{
			name: "REDIS_AUTO_PIPELINE with a cluster",
			env:  env("REDIS_AUTO_PIPELINE", "true", "REDIS_CLUSTER_ADDRS", "node-a:7000"),
			want: func(s *idempotency.Settings) {
				s.RedisAutoPipeline, s.RedisClusterAddrs = true, []string{"node-a:7000"}
			},
		},
		{name: "REDIS_AUTO_PIPELINE not a boolean", env: env("REDIS_AUTO_PIPELINE", "on"), wantErr: []string{`IDEMPOTENCY_REDIS_AUTO_PIPELINE: "on" is not a boolean; use true or false`}},
		{name: "REDIS_AUTO_PIPELINE empty", env: env("REDIS_AUTO_PIPELINE", ""), wantErr: []string{`IDEMPOTENCY_REDIS_AUTO_PIPELINE: "" is not a boolean`}},

		// RECORD_FORMAT
		{name: "RECORD_FORMAT 1", env: env("RECORD_FORMAT", "1"), want: func(s *idempotency.Settings) { s.RecordFormat = 1 }},
		{name: "RECORD_FORMAT 2", env: env("RECORD_FORMAT", "2")},
		{name: "RECORD_FORMAT 3", env: env("RECORD_FORMAT", "3"), wantErr: []string{"IDEMPOTENCY_RECORD_FORMAT: must be 1 or 2, got 3"}},
		{name: "RECORD_FORMAT not a number", env: env("RECORD_FORMAT", "v2"), wantErr: []string{"IDEMPOTENCY_RECORD_FORMAT"}},

		// KEY_PREFIX
		{name: "KEY_PREFIX set", env: env("KEY_PREFIX", "shop:idem:"), want: func(s *idempotency.Settings) { s.KeyPrefix = "shop:idem:" }},
		{name: "KEY_PREFIX empty", env: env("KEY_PREFIX", ""), want: func(s *idempotency.Settings) { s.KeyPrefix = "" }},

		// DEFAULT_TTL, MIN_TTL, MAX_TTL
		{name: "DEFAULT_TTL 24h", env: env("DEFAULT_TTL", "24h"), want: func(s *idempotency.Settings) { s.DefaultTTL = 24 * time.Hour }},
		{name: "DEFAULT_TTL not a duration", env: env("DEFAULT_TTL", "1d"), wantErr: []string{`IDEMPOTENCY_DEFAULT_TTL: "1d" is not a duration`}},
		{name: "DEFAULT_TTL below MIN_TTL", env: env("DEFAULT_TTL", "500ms"), wantErr: []string{"IDEMPOTENCY_DEFAULT_TTL: must be within IDEMPOTENCY_MIN_TTL and IDEMPOTENCY_MAX_TTL [1s, 720h0m0s], got 500ms"}},
		{name: "DEFAULT_TTL above MAX_TTL", env: env("DEFAULT_TTL", "721h"), wantErr: []string{"IDEMPOTENCY_DEFAULT_TTL: must be within", "got 721h0m0s"}},
		{name: "MIN_TTL 100ms", env: env("MIN_TTL", "100ms"), want: func(s *idempotency.Settings) { s.MinTTL = 100 * time.Millisecond }},
		{name: "MIN_TTL zero", env: env("MIN_TTL", "0s"), wantErr: []string{"IDEMPOTENCY_MIN_TTL: must be at least 1ms, got 0s"}},
		{name: "MIN_TTL above DEFAULT_TTL", env: env("MIN_TTL", "2h"), wantErr: []string{"IDEMPOTENCY_DEFAULT_TTL: must be within IDEMPOTENCY_MIN_TTL and IDEMPOTENCY_MAX_TTL [2h0m0s, 720h0m0s], got 1h0m0s"}},
		{name: "MIN_TTL empty", env: env("MIN_TTL", ""), wantErr: []string{`IDEMPOTENCY_MIN_TTL: "" is not a duration`}},
		{name: "MAX_TTL 48h", env: env("MAX_TTL", "48h"), want: func(s *idempotency.Settings) { s.MaxTTL = 48 * time.Hour }},
		{
			name:    "MAX_TTL below MIN_TTL",
			env:     map[string]string{"IDEMPOTENCY_MAX_TTL": "500ms", "IDEMPOTENCY_DEFAULT_TTL": "1s"},
			wantErr: []string{"IDEMPOTENCY_MAX_TTL: must not be shorter than IDEMPOTENCY_MIN_TTL (1s), got 500ms"},
		},
		{name: "MAX_TTL not a duration", env: env("MAX_TTL", "30 days"), wantErr: []string{`IDEMPOTENCY_MAX_TTL: "30 days" is not a duration`}},

		// OPERATION_TTLS
		{
			name: "OPERATION_TTLS two entries",
			env:  env("OPERATION_TTLS", "payment.charge:24h,order.create:1h"),
			want: func(s *idempotency.Settings) {
				s.OperationTTLS = idempotency.OperationTTLs{"payment.charge": 24 * time.Hour, "order.create": time.Hour}
			},
		},
		{
			name: "OPERATION_TTLS spaces and empty entries",
			env:  env("OPERATION_TTLS", " payment.charge : 24h , ,order.create:1h, "),
			want: func(s *idempotency.Settings) {
				s.OperationTTLS = idempotency.OperationTTLs{"payment.charge": 24 * time.Hour, "order.create": time.Hour}
			},
		},
		{name: "OPERATION_TTLS empty", env: env("OPERATION_TTLS", "")},
		{name: "OPERATION_TTLS only commas", env: env("OPERATION_TTLS", " , ,")},
		{name: "OPERATION_TTLS entry without colon", env: env("OPERATION_TTLS", "payment.charge:24h,order.create"), wantErr: []string{`IDEMPOTENCY_OPERATION_TTLS: entry "order.create": want operation:duration`}},
		{name: "OPERATION_TTLS bad duration", env: env("OPERATION_TTLS", "payment.charge:1d"), wantErr: []string{`IDEMPOTENCY_OPERATION_TTLS: entry "payment.charge:1d": "1d" is not a duration`}},
		{name: "OPERATION_TTLS two colons", env: env("OPERATION_TTLS", "payment:charge:1h"), wantErr: []string{`IDEMPOTENCY_OPERATION_TTLS: entry "payment:charge:1h": "charge:1h" is not a duration`}},
		{name: "OPERATION_TTLS duplicate operation", env: env("OPERATION_TTLS", "payment.charge:24h,payment.charge:1h"), wantErr: []string{`IDEMPOTENCY_OPERATION_TTLS: entry "payment.charge:1h": operation "payment.charge" appears more than once`}},
		{name: "OPERATION_TTLS bad operation", env: env("OPERATION_TTLS", "payment charge:1h"), wantErr: []string{`IDEMPOTENCY_OPERATION_TTLS: operation "payment charge" has byte 0x20 at offset 7`}},
		{name: "OPERATION_TTLS empty operation", env: env("OPERATION_TTLS", ":1h"), wantErr: []string{`IDEMPOTENCY_OPERATION_TTLS: operation "": operation is empty`}},
		{name: "OPERATION_TTLS below MIN_TTL", env: env("OPERATION_TTLS", "payment.charge:500ms"), wantErr: []string{`IDEMPOTENCY_OPERATION_TTLS: operation "payment.charge": TTL 500ms is not within IDEMPOTENCY_MIN_TTL and IDEMPOTENCY_MAX_TTL [1s, 720h0m0s]`}},
		{name: "OPERATION_TTLS above MAX_TTL", env: env("OPERATION_TTLS", "payment.charge:721h"), wantErr: []string{`IDEMPOTENCY_OPERATION_TTLS: operation "payment.charge": TTL 721h0m0s is not within`}},
		{name: "OPERATION_TTLS negative", env: env("OPERATION_TTLS", "payment.charge:-1h"), wantErr: []string{`IDEMPOTENCY_OPERATION_TTLS: operation "payment.charge": TTL -1h0m0s is not within`}},
		{
			name: "OPERATION_TTLS bounds follow MIN_TTL and MAX_TTL",
			env:  map[string]string{"IDEMPOTENCY_OPERATION_TTLS": "payment.charge:500ms", "IDEMPOTENCY_MIN_TTL": "100ms"},
			want: func(s *idempotency.Settings) {
				s.MinTTL = 100 * time.Millisecond
				s.OperationTTLS = idempotency.OperationTTLs{"payment.charge": 500 * time.Millisecond}
			},
		},

		// IN_FLIGHT
		{name: "IN_FLIGHT raise", env: env("IN_FLIGHT", "raise"), want: func(s *idempotency.Settings) { s.InFlight = coordinator.InFlightRaise }},
		{name: "IN_FLIGHT run", env: env("IN_FLIGHT", "run"), want: func(s *idempotency.Settings) { s.InFlight = coordinator.InFlightRun }},
		{name: "IN_FLIGHT wait", env: env("IN_FLIGHT", "wait")},
		{name: "IN_FLIGHT empty means wait", env: env("IN_FLIGHT", "")},
		{name: "IN_FLIGHT unknown", env: env("IN_FLIGHT", "queue"), wantErr: []string{"IDEMPOTENCY_IN_FLIGHT", `"queue"`, "accepted values are wait, raise, run"}},
		{name: "IN_FLIGHT wrong case", env: env("IN_FLIGHT", "Wait"), wantErr: []string{"IDEMPOTENCY_IN_FLIGHT", "accepted values are wait, raise, run"}},

		// LEASE
		{name: "LEASE 2s", env: env("LEASE", "2s"), want: func(s *idempotency.Settings) { s.Lease = 2 * time.Second }},
		{name: "LEASE 1ms", env: env("LEASE", "1ms", "STORAGE_TIMEOUT", "500us"), want: func(s *idempotency.Settings) {
			s.Lease, s.StorageTimeout = time.Millisecond, 500*time.Microsecond
		}},
		{name: "LEASE too short for a slow renewal", env: env("LEASE", "300ms", "STORAGE_TIMEOUT", "1s"), wantErr: []string{
			"IDEMPOTENCY_LEASE: must be longer than IDEMPOTENCY_RENEW_INTERVAL (100ms) plus IDEMPOTENCY_STORAGE_TIMEOUT (1s) plus a tenth of itself " +
				"(the watchdog's margin), so that one slow renewal cannot lose it: more than 1.222s, got 300ms"}},
		{name: "LEASE zero", env: env("LEASE", "0s"), wantErr: []string{"IDEMPOTENCY_LEASE: must be at least 1ms, got 0s"}},
		{name: "LEASE below 1ms", env: env("LEASE", "500us"), wantErr: []string{"IDEMPOTENCY_LEASE: must be at least 1ms, got 500µs"}},
		{name: "LEASE without unit", env: env("LEASE", "30"), wantErr: []string{`IDEMPOTENCY_LEASE: "30" is not a duration; use a Go duration such as 500ms, 30s or 1h30m`}},
		{name: "LEASE empty", env: env("LEASE", ""), wantErr: []string{`IDEMPOTENCY_LEASE: "" is not a duration`}},

		// RENEW_INTERVAL
		{name: "RENEW_INTERVAL 5s", env: env("RENEW_INTERVAL", "5s"), want: func(s *idempotency.Settings) { s.RenewInterval = 5 * time.Second }},
		{name: "RENEW_INTERVAL 0 means derived", env: env("RENEW_INTERVAL", "0")},
		{name: "RENEW_INTERVAL equal to LEASE", env: env("RENEW_INTERVAL", "30s"), wantErr: []string{"IDEMPOTENCY_RENEW_INTERVAL: must be shorter than IDEMPOTENCY_LEASE (30s), got 30s"}},
		{
			name:    "RENEW_INTERVAL longer than a shorter LEASE",
			env:     map[string]string{"IDEMPOTENCY_LEASE": "10s", "IDEMPOTENCY_RENEW_INTERVAL": "15s"},
			wantErr: []string{"IDEMPOTENCY_RENEW_INTERVAL: must be shorter than IDEMPOTENCY_LEASE (10s), got 15s"},
		},
		{name: "RENEW_INTERVAL negative", env: env("RENEW_INTERVAL", "-1s"), wantErr: []string{"IDEMPOTENCY_RENEW_INTERVAL: must not be negative (0s means a third of the lease), got -1s"}},
		{name: "RENEW_INTERVAL empty", env: env("RENEW_INTERVAL", ""), wantErr: []string{`IDEMPOTENCY_RENEW_INTERVAL: "" is not a duration`}},

		// WAIT_TIMEOUT
		{name: "WAIT_TIMEOUT 2m", env: env("WAIT_TIMEOUT", "2m"), want: func(s *idempotency.Settings) { s.WaitTimeout = 2 * time.Minute }},
		{name: "WAIT_TIMEOUT longer than LEASE", env: env("WAIT_TIMEOUT", "90s"), want: func(s *idempotency.Settings) { s.WaitTimeout = 90 * time.Second }},
		{name: "WAIT_TIMEOUT 0 means derived", env: env("WAIT_TIMEOUT", "0s")},
		{name: "WAIT_TIMEOUT negative", env: env("WAIT_TIMEOUT", "-1s"), wantErr: []string{"IDEMPOTENCY_WAIT_TIMEOUT: must not be negative (0s means one lease), got -1s"}},
		{name: "WAIT_TIMEOUT not a duration", env: env("WAIT_TIMEOUT", "forever"), wantErr: []string{`IDEMPOTENCY_WAIT_TIMEOUT: "forever" is not a duration`}},

		// POLL_INTERVAL
		{name: "POLL_INTERVAL 50ms", env: env("POLL_INTERVAL", "50ms"), want: func(s *idempotency.Settings) { s.PollInterval = 50 * time.Millisecond }},
		{name: "POLL_INTERVAL zero", env: env("POLL_INTERVAL", "0s"), wantErr: []string{"IDEMPOTENCY_POLL_INTERVAL: must be positive, got 0s"}},
		{name: "POLL_INTERVAL negative", env: env("POLL_INTERVAL", "-10ms"), wantErr: []string{"IDEMPOTENCY_POLL_INTERVAL: must be positive, got -10ms"}},

		// ON_STORAGE_ERROR
		{name: "ON_STORAGE_ERROR raise", env: env("ON_STORAGE_ERROR", "raise"), want: func(s *idempotency.Settings) { s.OnStorageError = coordinator.OnStorageErrorRaise }},
		{name: "ON_STORAGE_ERROR run", env: env("ON_STORAGE_ERROR", "run")},
		{name: "ON_STORAGE_ERROR empty means run", env: env("ON_STORAGE_ERROR", "")},
		{name: "ON_STORAGE_ERROR unknown", env: env("ON_STORAGE_ERROR", "fail"), wantErr: []string{"IDEMPOTENCY_ON_STORAGE_ERROR", `"fail"`, "accepted values are run, raise"}},
		{name: "ON_STORAGE_ERROR wrong case", env: env("ON_STORAGE_ERROR", "RAISE"), wantErr: []string{"IDEMPOTENCY_ON_STORAGE_ERROR", "run, raise"}},

		// BREAKER_FAILURES, BREAKER_COOLDOWN
		{name: "BREAKER_FAILURES 10", env: env("BREAKER_FAILURES", "10"), want: func(s *idempotency.Settings) { s.BreakerFailures = 10 }},
		{name: "BREAKER_FAILURES 0 turns it off", env: env("BREAKER_FAILURES", "0", "BREAKER_COOLDOWN", "0s"), want: func(s *idempotency.Settings) { s.BreakerFailures, s.BreakerCooldown = 0, 0 }},
		{name: "BREAKER_FAILURES negative", env: env("BREAKER_FAILURES", "-1"), wantErr: []string{"IDEMPOTENCY_BREAKER_FAILURES: must be 0 (no breaker) or more, got -1"}},
		{name: "BREAKER_FAILURES not a number", env: env("BREAKER_FAILURES", "many"), wantErr: []string{"IDEMPOTENCY_BREAKER_FAILURES"}},
		{name: "BREAKER_COOLDOWN 250ms", env: env("BREAKER_COOLDOWN", "250ms"), want: func(s *idempotency.Settings) { s.BreakerCooldown = 250 * time.Millisecond }},
		{name: "BREAKER_COOLDOWN zero", env: env("BREAKER_COOLDOWN", "0s"), wantErr: []string{"IDEMPOTENCY_BREAKER_COOLDOWN: must be positive", "IDEMPOTENCY_BREAKER_FAILURES is not 0, got 0s"}},

		// STORAGE_TIMEOUT
		{name: "STORAGE_TIMEOUT 250ms", env: env("STORAGE_TIMEOUT", "250ms"), want: func(s *idempotency.Settings) { s.StorageTimeout = 250 * time.Millisecond }},
		{name: "STORAGE_TIMEOUT zero", env: env("STORAGE_TIMEOUT", "0s"), wantErr: []string{"IDEMPOTENCY_STORAGE_TIMEOUT: must be positive, got 0s"}},
		{name: "STORAGE_TIMEOUT not a duration", env: env("STORAGE_TIMEOUT", "1 second"), wantErr: []string{`IDEMPOTENCY_STORAGE_TIMEOUT: "1 second" is not a duration`}},

		// MAX_RESULT_BYTES
		{name: "MAX_RESULT_BYTES 65536", env: env("MAX_RESULT_BYTES", "65536"), want: func(s *idempotency.Settings) { s.MaxResultBytes = 65536 }},
		{name: "MAX_RESULT_BYTES zero", env: env("MAX_RESULT_BYTES", "0"), wantErr: []string{"IDEMPOTENCY_MAX_RESULT_BYTES: must be positive, got 0"}},
		{name: "MAX_RESULT_BYTES negative", env: env("MAX_RESULT_BYTES", "-1"), wantErr: []string{"IDEMPOTENCY_MAX_RESULT_BYTES: must be positive, got -1"}},
		{name: "MAX_RESULT_BYTES with unit", env: env("MAX_RESULT_BYTES", "1MB"), wantErr: []string{`IDEMPOTENCY_MAX_RESULT_BYTES: "1MB" is not an integer`}},
		{name: "MAX_RESULT_BYTES out of range", env: env("MAX_RESULT_BYTES", "99999999999999999999"), wantErr: []string{`IDEMPOTENCY_MAX_RESULT_BYTES: "99999999999999999999" is out of range`}},

		// Integers are decimal: envconfig would read 010 as 8 and take 0x10
		// and 1_000 (strconv.ParseInt's base 0).
		{name: "REDIS_COALESCE_LANES 10", env: env("REDIS_COALESCE_LANES", "10"), want: func(s *idempotency.Settings) { s.RedisCoalesceLanes = 10 }},
		{name: "REDIS_COALESCE_LANES leading zero", env: env("REDIS_COALESCE_LANES", "010"), wantErr: []string{`IDEMPOTENCY_REDIS_COALESCE_LANES: "010" is not a decimal whole number`}},
		{name: "REDIS_COALESCE_LANES hex", env: env("REDIS_COALESCE_LANES", "0x10"), wantErr: []string{`IDEMPOTENCY_REDIS_COALESCE_LANES: "0x10" is not a decimal whole number`}},
		{name: "REDIS_COALESCE_LANES 0", env: env("REDIS_COALESCE_LANES", "0"), want: func(s *idempotency.Settings) { s.RedisCoalesceLanes = 0 }},
		{name: "MAX_RESULT_BYTES underscores", env: env("MAX_RESULT_BYTES", "1_000"), wantErr: []string{`IDEMPOTENCY_MAX_RESULT_BYTES: "1_000" is not a decimal whole number`}},
		{name: "MAX_RESULT_BYTES octal", env: env("MAX_RESULT_BYTES", "0o777"), wantErr: []string{`IDEMPOTENCY_MAX_RESULT_BYTES: "0o777" is not a decimal whole number`}},
		{name: "RECORD_FORMAT binary", env: env("RECORD_FORMAT", "0b10"), wantErr: []string{`IDEMPOTENCY_RECORD_FORMAT: "0b10" is not a decimal whole number`}},
		{name: "REDIS_REPLICA_ACKS leading zero", env: env("REDIS_REPLICA_ACKS", "01"), wantErr: []string{`IDEMPOTENCY_REDIS_REPLICA_ACKS: "01" is not a decimal whole number`}},
		{name: "BREAKER_FAILURES negative hex", env: env("BREAKER_FAILURES", "-0x1"), wantErr: []string{`IDEMPOTENCY_BREAKER_FAILURES: "-0x1" is not a decimal whole number`}},
		{name: "BREAKER_FAILURES plus sign", env: env("BREAKER_FAILURES", "+7"), want: func(s *idempotency.Settings) { s.BreakerFailures = 7 }},

		// METRICS_ENABLED
		{name: "METRICS_ENABLED false", env: env("METRICS_ENABLED", "false"), want: func(s *idempotency.Settings) { s.MetricsEnabled = false }},
		{name: "METRICS_ENABLED not a boolean", env: env("METRICS_ENABLED", "off"), wantErr: []string{`IDEMPOTENCY_METRICS_ENABLED: "off" is not a boolean`}},

		// METRICS_NAMESPACE
		{name: "METRICS_NAMESPACE shop", env: env("METRICS_NAMESPACE", "shop"), want: func(s *idempotency.Settings) { s.MetricsNamespace = "shop" }},
		{name: "METRICS_NAMESPACE with underscore and digit", env: env("METRICS_NAMESPACE", "_my_app2"), want: func(s *idempotency.Settings) { s.MetricsNamespace = "_my_app2" }},
		{name: "METRICS_NAMESPACE empty", env: env("METRICS_NAMESPACE", "")},
		{name: "METRICS_NAMESPACE dash", env: env("METRICS_NAMESPACE", "my-app"), wantErr: []string{`IDEMPOTENCY_METRICS_NAMESPACE: "my-app" is not a Prometheus name`}},
		{name: "METRICS_NAMESPACE leading digit", env: env("METRICS_NAMESPACE", "2fast"), wantErr: []string{`IDEMPOTENCY_METRICS_NAMESPACE: "2fast" is not a Prometheus name`}},
		{name: "METRICS_NAMESPACE colon", env: env("METRICS_NAMESPACE", "shop:api"), wantErr: []string{`IDEMPOTENCY_METRICS_NAMESPACE: "shop:api" is not a Prometheus name`}},

		// LOG_KEYS
		{name: "LOG_KEYS plain", env: env("LOG_KEYS", "plain"), want: func(s *idempotency.Settings) { s.LogKeys = observability.LogKeysPlain }},
		{name: "LOG_KEYS omitted", env: env("LOG_KEYS", "omitted"), want: func(s *idempotency.Settings) { s.LogKeys = observability.LogKeysOmitted }},
		{name: "LOG_KEYS hashed", env: env("LOG_KEYS", "hashed")},
		{name: "LOG_KEYS empty means hashed", env: env("LOG_KEYS", "")},
		{name: "LOG_KEYS unknown", env: env("LOG_KEYS", "sha256"), wantErr: []string{"IDEMPOTENCY_LOG_KEYS", `"sha256"`, "accepted values are hashed, plain, omitted"}},

		// Several at once.
		{
			name: "every variable set",
			env: map[string]string{
				"IDEMPOTENCY_ENABLED":              "false",
				"IDEMPOTENCY_REDIS_URL":            "redis://cache:6379/0",
				"IDEMPOTENCY_REDIS_CLUSTER_ADDRS":  "node-a:7000",
				"IDEMPOTENCY_REDIS_AUTO_PIPELINE":  "true",
				"IDEMPOTENCY_REDIS_COALESCE_LANES": "3",
				"IDEMPOTENCY_KEY_PREFIX":           "p:",
				"IDEMPOTENCY_RECORD_FORMAT":        "1",
				"IDEMPOTENCY_DEFAULT_TTL":          "2h",
				"IDEMPOTENCY_MIN_TTL":              "1m",
				"IDEMPOTENCY_MAX_TTL":              "48h",
				"IDEMPOTENCY_OPERATION_TTLS":       "a.b:3h",
				"IDEMPOTENCY_IN_FLIGHT":            "run",
				"IDEMPOTENCY_LEASE":                "9s",
				"IDEMPOTENCY_RENEW_INTERVAL":       "2s",
				"IDEMPOTENCY_WAIT_TIMEOUT":         "5s",
				"IDEMPOTENCY_POLL_INTERVAL":        "20ms",
				"IDEMPOTENCY_ON_STORAGE_ERROR":     "raise",
				"IDEMPOTENCY_STORAGE_TIMEOUT":      "300ms",
				"IDEMPOTENCY_BREAKER_FAILURES":     "3",
				"IDEMPOTENCY_BREAKER_COOLDOWN":     "250ms",
				"IDEMPOTENCY_MAX_RESULT_BYTES":     "4096",
				"IDEMPOTENCY_METRICS_ENABLED":      "false",
				"IDEMPOTENCY_METRICS_NAMESPACE":    "shop",
				"IDEMPOTENCY_TRACING_ENABLED":      "false",
				"IDEMPOTENCY_LOG_KEYS":             "omitted",
				"IDEMPOTENCY_REDIS_LOGS":           "keep",
				// REDIS_SENTINEL_*, which cannot be combined with
				// REDIS_CLUSTER_ADDRS: "REDIS_SENTINEL master and sentinels".
			},
			want: func(s *idempotency.Settings) {
				*s = idempotency.Settings{
					Enabled:            false,
					RedisURL:           "redis://cache:6379/0",
					RedisClusterAddrs:  []string{"node-a:7000"},
					RedisAutoPipeline:  true,
					RedisCoalesceLanes: 3,
					KeyPrefix:          "p:",
					RecordFormat:       1,
					DefaultTTL:         2 * time.Hour,
					MinTTL:             time.Minute,
					MaxTTL:             48 * time.Hour,
					OperationTTLS:      idempotency.OperationTTLs{"a.b": 3 * time.Hour},
					InFlight:           coordinator.InFlightRun,
					Lease:              9 * time.Second,
					RenewInterval:      2 * time.Second,
					WaitTimeout:        5 * time.Second,
					PollInterval:       20 * time.Millisecond,
					OnStorageError:     coordinator.OnStorageErrorRaise,
					StorageTimeout:     300 * time.Millisecond,
					BreakerFailures:    3,
					BreakerCooldown:    250 * time.Millisecond,
					MaxResultBytes:     4096,
					MetricsEnabled:     false,
					MetricsNamespace:   "shop",
					TracingEnabled:     false,
					LogKeys:            observability.LogKeysOmitted,
					RedisLogs:          idempotency.RedisLogsKeep,
				}
			},
		},
		{
			name: "every parse error is reported at once",
			env: map[string]string{
				"IDEMPOTENCY_ENABLED":             "yes",
				"IDEMPOTENCY_LEASE":               "abc",
				"IDEMPOTENCY_ON_STORAGE_ERROR":    "fail",
				"IDEMPOTENCY_REDIS_AUTO_PIPELINE": "yes",
			},
			wantErr: []string{"IDEMPOTENCY_ENABLED", "IDEMPOTENCY_LEASE", "IDEMPOTENCY_ON_STORAGE_ERROR", "IDEMPOTENCY_REDIS_AUTO_PIPELINE"},
		},
		{
			name: "every validation error is reported at once",
			env: map[string]string{
				"IDEMPOTENCY_LEASE":            "0s",
				"IDEMPOTENCY_MAX_RESULT_BYTES": "0",
				"IDEMPOTENCY_REDIS_URL":        "http://cache",
				"IDEMPOTENCY_OPERATION_TTLS":   "a:1ms,b:1ms",
			},
			wantErr: []string{
				"idempotency: invalid settings:",
				"IDEMPOTENCY_LEASE:",
				"IDEMPOTENCY_MAX_RESULT_BYTES:",
				"IDEMPOTENCY_REDIS_URL:",
				`IDEMPOTENCY_OPERATION_TTLS: operation "a"`,
				`IDEMPOTENCY_OPERATION_TTLS: operation "b"`,
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			clearEnv(t)
			for k, v := range tt.env {
				t.Setenv(k, v)
			}
			got, err := idempotency.LoadSettings()
			if len(tt.wantErr) > 0 {
				if err == nil {
					t.Fatalf("LoadSettings() = %+v, nil; want an error containing %q", got, tt.wantErr)
				}
				for _, sub := range tt.wantErr {
					if !strings.Contains(err.Error(), sub) {
						t.Errorf("LoadSettings() error = %q\nwant it to contain %q", err, sub)
					}
				}
				if !reflect.DeepEqual(got, idempotency.Settings{}) {
					t.Errorf("LoadSettings() returned %+v with its error; want the zero Settings", got)
				}
				return
			}
			if err != nil {
				t.Fatalf("LoadSettings() error = %v", err)
			}
			want := contractDefaults()
			if tt.want != nil {
				tt.want(&want)
			}
			if !reflect.DeepEqual(got, want) {
				t.Errorf("LoadSettings() =\n%+v\nwant\n%+v", got, want)
			}
			// What Validate accepts, coordinator.New accepts.
			if _, err := coordinator.New(&recordingStore{}, got.CoordinatorOptions()...); err != nil {
				t.Errorf("coordinator.New(store, CoordinatorOptions()...) error = %v", err)
			}
		})
	}
}

// env returns one IDEMPOTENCY_ variable.
// env returns IDEMPOTENCY_-prefixed variables from name, value pairs.
func env(nameValues ...string) map[string]string {
	m := make(map[string]string, len(nameValues)/2)
	for i := 0; i+1 < len(nameValues); i += 2 {
		m["IDEMPOTENCY_"+nameValues[i]] = nameValues[i+1]
	}
	return m
}

// TestLoadSettingsUnknownVariables: a misspelt IDEMPOTENCY_* variable must not
// quietly leave the default in force. The test harness's IDEMPOTENCY_TEST_*
// variables and variables that only look alike are not LoadSettings' to judge.
func TestLoadSettingsUnknownVariables(t *testing.T) {
	tests := []struct {
		name string
		env  map[string]string
		// wantErr lists the lines the error must have; empty expects none.
		wantErr []string
		// hidden are strings the error must not show.
		hidden []string
	}{
		{
			name:    "a misspelt mode",
			env:     env("ON_STORAGE_ERRORS", "raise"),
			wantErr: []string{"IDEMPOTENCY_ON_STORAGE_ERRORS: unknown variable: no package of this program reads it; did you mean IDEMPOTENCY_ON_STORAGE_ERROR? (every variable: https://github.com/idemkit/idempotency/blob/main/docs/configuration.md)"},
			hidden:  []string{"raise"},
		},
		{
			// Auto-pipelining is as often spelt in one word.
			name:    "AUTOPIPELINE in one word",
			env:     env("REDIS_AUTOPIPELINE", "true"),
			wantErr: []string{"IDEMPOTENCY_REDIS_AUTOPIPELINE: unknown variable: no package of this program reads it; did you mean IDEMPOTENCY_REDIS_AUTO_PIPELINE? (every variable: https://github.com/idemkit/idempotency/blob/main/docs/configuration.md)"},
		},
		{
			// As close to MIN_TTL and MAX_TTL, but the default is what a
			// bare TTL most likely means.
			name:    "TTL without DEFAULT_",
			env:     env("TTL", "24h"),
			wantErr: []string{"IDEMPOTENCY_TTL: unknown variable: no package of this program reads it; did you mean IDEMPOTENCY_DEFAULT_TTL? (every variable: https://github.com/idemkit/idempotency/blob/main/docs/configuration.md)"},
			hidden:  []string{"24h"},
		},
		{name: "a test variable", env: env("TEST_ANYTHING", "1")},
		{name: "the bare test prefix", env: env("TEST_", "1")},
		{name: "lowercase is another variable", env: map[string]string{"idempotency_lease": "0s", "Idempotency_Leases": "0s"}},
		{name: "without the underscore", env: map[string]string{"IDEMPOTENCY": "1", "IDEMPOTENCYLEASE": "0s"}},
		{
			name: "two unknown variables, in order",
			env:  map[string]string{"IDEMPOTENCY_LEASES": "1s", "IDEMPOTENCY_KEYPREFIX": "p:"},
			wantErr: []string{
				"IDEMPOTENCY_KEYPREFIX: unknown variable: no package of this program reads it; did you mean IDEMPOTENCY_KEY_PREFIX? (every variable: https://github.com/idemkit/idempotency/blob/main/docs/configuration.md)",
				"IDEMPOTENCY_LEASES: unknown variable: no package of this program reads it; did you mean IDEMPOTENCY_LEASE? (every variable: https://github.com/idemkit/idempotency/blob/main/docs/configuration.md)",
			},
		},
		{
			name:    "set but empty is still set",
			env:     env("REDIS_ADDR", ""),
			wantErr: []string{"IDEMPOTENCY_REDIS_ADDR: unknown variable: no package of this program reads it; did you mean"},
		},
		{
			// The value may be a secret that was meant for a known variable.
			name:    "the value is not shown",
			env:     env("REDIS_PASSWORD", "hunter2"),
			wantErr: []string{"IDEMPOTENCY_REDIS_PASSWORD: unknown variable: no package of this program reads it; did you mean"},
			hidden:  []string{"hunter2"},
		},
		{
			name: "reported with the parse errors",
			env:  map[string]string{"IDEMPOTENCY_LEASE": "abc", "IDEMPOTENCY_IN_FLIGH": "raise"},
			wantErr: []string{
				`IDEMPOTENCY_LEASE: "abc" is not a duration; use a Go duration such as 500ms, 30s or 1h30m`,
				"IDEMPOTENCY_IN_FLIGH: unknown variable: no package of this program reads it; did you mean IDEMPOTENCY_IN_FLIGHT? (every variable: https://github.com/idemkit/idempotency/blob/main/docs/configuration.md)",
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			clearEnv(t)
			for k, v := range tt.env {
				t.Setenv(k, v)
			}
			got, err := idempotency.LoadSettings()
			if len(tt.wantErr) == 0 {
				if err != nil {
					t.Fatalf("LoadSettings() error = %v, want nil", err)
				}
				if want := contractDefaults(); !reflect.DeepEqual(got, want) {
					t.Fatalf("LoadSettings() =\n%+v\nwant the defaults\n%+v", got, want)
				}
				return
			}
			if err == nil {
				t.Fatalf("LoadSettings() = %+v, nil; want an error", got)
			}
			if !reflect.DeepEqual(got, idempotency.Settings{}) {
				t.Errorf("LoadSettings() returned %+v with its error; want the zero Settings", got)
			}
			lines := strings.Split(err.Error(), "\n")
			if lines[0] != "idempotency: invalid settings:" || len(lines) != 1+len(tt.wantErr) {
				t.Fatalf("LoadSettings() error = %q\nwant the header and %d lines", err, len(tt.wantErr))
			}
			for i, want := range tt.wantErr {
				if !strings.HasPrefix(lines[1+i], want) {
					t.Errorf("line %d = %q\nwant %q", 1+i, lines[1+i], want)
				}
			}
			for _, h := range tt.hidden {
				if strings.Contains(err.Error(), h) {
					t.Errorf("LoadSettings() error = %q; shows %q", err, h)
				}
			}
		})
	}
}

func TestLoadSettingsRedisURLErrorHidesPassword(t *testing.T) {
	for _, raw := range []string{
		"redis://:hunter2@cache:6379/zero",
		"redis://app:hunter2@cache:6379/0?colour=blue",
		"redis://app:hunter2@[::1",
		"http://app:hunter2@cache:6379",
	} {
		clearEnv(t)
		t.Setenv("IDEMPOTENCY_REDIS_URL", raw)
		_, err := idempotency.LoadSettings()
		if err == nil {
			t.Fatalf("REDIS_URL=%s: LoadSettings() error = nil, want one", raw)
		}
		if strings.Contains(err.Error(), "hunter2") {
			t.Errorf("REDIS_URL=%s: LoadSettings() error = %q, which shows the password", raw, err)
		}
	}
}

func TestSettingsStringHidesPassword(t *testing.T) {
	s := idempotency.DefaultSettings()
	s.RedisURL = "rediss://app:hunter2@cache:6380/1"
	got := s.String()
	if strings.Contains(got, "hunter2") || !strings.Contains(got, "rediss://app:xxxxx@cache:6380/1") {
		t.Errorf("String() = %s; want the URL with its password redacted", got)
	}
	if got2 := fmt.Sprintf("%+v", s); got2 != got {
		t.Errorf("%%+v = %s; want String()", got2)
	}
	s.RedisURL = "redis://app:hunter2@[::1"
	if got := s.String(); strings.Contains(got, "hunter2") {
		t.Errorf("String() = %s; shows the password of an invalid URL", got)
	}
}

func TestDefaultSettings(t *testing.T) {
	if got, want := idempotency.DefaultSettings(), contractDefaults(); !reflect.DeepEqual(got, want) {
		t.Errorf("DefaultSettings() =\n%+v\nwant\n%+v", got, want)
	}
	if err := idempotency.DefaultSettings().Validate(); err != nil {
		t.Errorf("DefaultSettings().Validate() = %v", err)
	}
}

func TestValidateZeroSettings(t *testing.T) {
	err := idempotency.Settings{}.Validate()
	if err == nil {
		t.Fatal("Settings{}.Validate() = nil, want an error")
	}
	for _, sub := range []string{
		"IDEMPOTENCY_REDIS_URL:",
		"IDEMPOTENCY_MIN_TTL: must be at least 1ms, got 0s",
		"IDEMPOTENCY_LEASE: must be at least 1ms, got 0s",
		"IDEMPOTENCY_POLL_INTERVAL:",
		"IDEMPOTENCY_STORAGE_TIMEOUT:",
		"IDEMPOTENCY_MAX_RESULT_BYTES:",
		"IDEMPOTENCY_RECORD_FORMAT: must be 1 or 2, got 0",
	} {
		if !strings.Contains(err.Error(), sub) {
			t.Errorf("Settings{}.Validate() = %q\nwant it to contain %q", err, sub)
		}
	}
}

func TestValidateModesSetInCode(t *testing.T) {
	s := idempotency.DefaultSettings()
	s.InFlight = "queue"
	s.OnStorageError = "fail"
	s.LogKeys = "sha256"
	err := s.Validate()
	if err == nil {
		t.Fatal("Validate() = nil, want an error")
	}
	for _, sub := range []string{
		"IDEMPOTENCY_IN_FLIGHT: unknown in-flight mode \"queue\": accepted values are wait, raise, run",
		"IDEMPOTENCY_ON_STORAGE_ERROR: unknown on-storage-error mode \"fail\": accepted values are run, raise",
		"IDEMPOTENCY_LOG_KEYS: unknown key logging mode \"sha256\": accepted values are hashed, plain, omitted",
	} {
		if !strings.Contains(err.Error(), sub) {
			t.Errorf("Validate() = %q\nwant it to contain %q", err, sub)
		}
	}

	// The zero modes are the defaults.
	s = idempotency.DefaultSettings()
	s.InFlight, s.OnStorageError, s.LogKeys = "", "", ""
	if err := s.Validate(); err != nil {
		t.Errorf("Validate() with zero modes = %v, want nil", err)
	}
}

// RedisLogs set in code is checked with the other settings, naming the
// variable and the accepted values: an unknown mode must not pass fx.New and
// fail only on start, where SetRedisLogger names no variable.
func TestValidateRedisLogsSetInCode(t *testing.T) {
	const want = `IDEMPOTENCY_REDIS_LOGS: unknown go-redis log mode "Off": accepted values are zap, off, keep`
	s := idempotency.DefaultSettings()
	s.RedisLogs = "Off"
	if err := s.Validate(); err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("Validate() = %v\nwant it to contain %q", err, want)
	}
	s.RedisLogs = ""
	if err := s.Validate(); err != nil {
		t.Errorf("Validate() with RedisLogs empty = %v, want nil (it means zap)", err)
	}

	clearEnv(t)
	app := fx.New(fx.NopLogger, idempotency.Module,
		idempotency.OverrideSettings(func(s *idempotency.Settings) { s.RedisLogs = "Off" }),
		fx.Invoke(func(*coordinator.Coordinator) {}))
	var se *idempotency.SettingsError
	if err := app.Err(); !errors.As(err, &se) || !strings.Contains(se.Error(), want) {
		t.Errorf("fx.New with RedisLogs %q = %v\nwant a *SettingsError containing %q", "Off", err, want)
	}
}

func TestOperationTTLsText(t *testing.T) {
	var m idempotency.OperationTTLs
	if err := m.UnmarshalText([]byte("order.create:1h, payment.charge:24h")); err != nil {
		t.Fatal(err)
	}
	const want = "order.create:1h0m0s,payment.charge:24h0m0s"
	if got := m.String(); got != want {
		t.Errorf("String() = %q, want %q", got, want)
	}
	var back idempotency.OperationTTLs
	if err := back.UnmarshalText([]byte(m.String())); err != nil || !reflect.DeepEqual(back, m) {
		t.Errorf("UnmarshalText(String()) = %v, %v; want %v", back, err, m)
	}
	if got := idempotency.OperationTTLs(nil).String(); got != "" {
		t.Errorf("nil String() = %q, want \"\"", got)
	}
}

// TestCoordinatorOptions checks that the settings reach the coordinator: the
// TTLs and the lease through the writes it makes to the store, the kill
// switch through the calls it does not make. TestModesReachTheCoordinator
// checks the modes by their behaviour.
func TestCoordinatorOptions(t *testing.T) {
	defer verifyNoLeaks(t, goleak.IgnoreCurrent()) // shared test Redis servers may be running

	s := idempotency.DefaultSettings()
	s.InFlight = coordinator.InFlightRaise
	s.OnStorageError = coordinator.OnStorageErrorRaise
	s.Lease = 2 * time.Second
	s.DefaultTTL = 2 * time.Hour
	s.OperationTTLS = idempotency.OperationTTLs{"payment.charge": 24 * time.Hour}
	if err := s.Validate(); err != nil {
		t.Fatal(err)
	}
	store := &recordingStore{}
	c, err := coordinator.New(store, s.CoordinatorOptions()...)
	if err != nil {
		t.Fatalf("coordinator.New() error = %v", err)
	}
	if !c.Enabled() {
		t.Error("coordinator: Enabled() = false, want true")
	}

	ok := func(context.Context) ([]byte, error) { return []byte(`"ok"`), nil }
	for _, tc := range []struct {
		op  string
		ttl time.Duration
	}{
		{"payment.charge", 24 * time.Hour}, // OPERATION_TTLS
		{"order.create", 2 * time.Hour},    // DEFAULT_TTL
	} {
		if _, err := c.Execute(t.Context(), coordinator.Call{Operation: tc.op, Key: "k1"}, ok); err != nil {
			t.Fatalf("Execute(%s) error = %v", tc.op, err)
		}
		if got := store.reserveTTL(tc.op); got != 2*time.Second {
			t.Errorf("%s: reserved with TTL %v, want the lease 2s", tc.op, got)
		}
		if got := store.completeTTL(tc.op); got != tc.ttl {
			t.Errorf("%s: completed with TTL %v, want %v", tc.op, got, tc.ttl)
		}
	}

	// The kill switch: the action runs, the store is not touched.
	s.Enabled = false
	store = &recordingStore{}
	c, err = coordinator.New(store, s.CoordinatorOptions()...)
	if err != nil {
		t.Fatalf("coordinator.New() error = %v", err)
	}
	if _, err := c.Execute(t.Context(), coordinator.Call{Operation: "payment.charge", Key: "k1"}, ok); err != nil {
		t.Fatalf("Execute() with Enabled false error = %v", err)
	}
	if n := store.calls(); n != 0 {
		t.Errorf("Enabled false: %d store calls, want 0", n)
	}
}

// recordingStore is an idemstore.Store where every reservation succeeds; it
// records the TTLs it is given, per operation.
type recordingStore struct {
	mu       sync.Mutex
	n        int
	reserve  map[string]time.Duration
	complete map[string]time.Duration
}

var _ idemstore.Store = (*recordingStore)(nil)

func (r *recordingStore) Reserve(_ context.Context, key idemstore.Key, w idemstore.Write) (idemstore.Record, bool, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.n++
	if r.reserve == nil {
		r.reserve = map[string]time.Duration{}
	}
	r.reserve[key.Operation] = w.TTL
	return idemstore.Record{}, true, nil
}

func (r *recordingStore) Get(context.Context, idemstore.Key) (idemstore.Record, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.n++
	return idemstore.Record{}, nil
}

func (r *recordingStore) Complete(_ context.Context, key idemstore.Key, _ string, c idemstore.Completion) (bool, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.n++
	if r.complete == nil {
		r.complete = map[string]time.Duration{}
	}
	r.complete[key.Operation] = c.TTL
	return true, nil
}

func (r *recordingStore) Release(context.Context, idemstore.Key, string) (bool, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.n++
	return true, nil
}

func (r *recordingStore) Renew(context.Context, idemstore.Key, string, time.Duration) (bool, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.n++
	return true, nil
}

func (r *recordingStore) reserveTTL(op string) time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.reserve[op]
}

func (r *recordingStore) completeTTL(op string) time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.complete[op]
}

func (r *recordingStore) calls() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.n
}

// TestModesReachTheCoordinator checks IDEMPOTENCY_IN_FLIGHT and
// IDEMPOTENCY_ON_STORAGE_ERROR by what the coordinator does with them.
func TestModesReachTheCoordinator(t *testing.T) {
	held := idemstore.Key{Operation: "payment.charge", Key: "held"}
	run := func(context.Context) (string, error) { return "ran", nil }
	for _, tc := range []struct {
		inFlight coordinator.InFlightMode
		onError  coordinator.OnStorageErrorMode
	}{
		{coordinator.InFlightRaise, coordinator.OnStorageErrorRaise},
		{coordinator.InFlightRun, coordinator.OnStorageErrorRun},
	} {
		t.Run(string(tc.inFlight)+"/"+string(tc.onError), func(t *testing.T) {
			s := idempotency.DefaultSettings()
			s.InFlight, s.OnStorageError = tc.inFlight, tc.onError
			store := &modeStore{held: held}
			c, err := coordinator.New(store, s.CoordinatorOptions()...)
			if err != nil {
				t.Fatal(err)
			}
			// A key another caller holds: raise refuses at once, run runs.
			v, err := coordinator.Do(t.Context(), c, coordinator.Call{Operation: held.Operation, Key: held.Key}, run)
			switch tc.inFlight {
			case coordinator.InFlightRaise:
				if !errors.Is(err, coordinator.ErrInProgress) {
					t.Fatalf("held key in mode raise: %q, %v; want ErrInProgress", v, err)
				}
			case coordinator.InFlightRun:
				if err != nil || v != "ran" {
					t.Fatalf("held key in mode run: %q, %v; want ran", v, err)
				}
			}
			// A store that fails: raise refuses, run runs unprotected.
			store.failing = true
			v, err = coordinator.Do(t.Context(), c, coordinator.Call{Operation: "payment.charge", Key: "down"}, run)
			switch tc.onError {
			case coordinator.OnStorageErrorRaise:
				if !errors.Is(err, coordinator.ErrStorage) {
					t.Fatalf("store down in mode raise: %q, %v; want ErrStorage", v, err)
				}
			case coordinator.OnStorageErrorRun:
				if err != nil || v != "ran" {
					t.Fatalf("store down in mode run: %q, %v; want ran", v, err)
				}
			}
		})
	}
}

// modeStore holds one key pending for another caller, and fails every call
// once failing is set.
type modeStore struct {
	recordingStore
	held    idemstore.Key
	failing bool
}

var errStoreDown = errors.New("store down")

func (m *modeStore) Reserve(ctx context.Context, key idemstore.Key, w idemstore.Write) (idemstore.Record, bool, error) {
	if rec, handled, err := m.answer(key); handled {
		return rec, false, err
	}
	return m.recordingStore.Reserve(ctx, key, w)
}

func (m *modeStore) Get(ctx context.Context, key idemstore.Key) (idemstore.Record, error) {
	if rec, handled, err := m.answer(key); handled {
		return rec, err
	}
	return m.recordingStore.Get(ctx, key)
}

// answer is what the store says without the recordingStore: an error when
// failing, the other caller's reservation for the held key.
func (m *modeStore) answer(key idemstore.Key) (rec idemstore.Record, handled bool, err error) {
	switch {
	case m.failing:
		return idemstore.Record{}, true, errStoreDown
	case key == m.held:
		return idemstore.Record{State: idemstore.StatePending, Token: "other", TTL: time.Second}, true, nil
	}
	return idemstore.Record{}, false, nil
}

// Every refusal comes back in one *SettingsError, each naming its variable.
func TestSettingsErrorHoldsEveryRefusal(t *testing.T) {
	t.Setenv("IDEMPOTENCY_LEASE", "banana")
	t.Setenv("IDEMPOTENCY_IN_FLIGHT", "later")
	_, err := idempotency.LoadSettings()
	var se *idempotency.SettingsError
	if !errors.As(err, &se) {
		t.Fatalf("LoadSettings() = %v, want a *idempotency.SettingsError", err)
	}
	var names []string
	for _, e := range se.Errs {
		names = append(names, strings.SplitN(e.Error(), ":", 2)[0])
	}
	slices.Sort(names)
	if want := []string{"IDEMPOTENCY_IN_FLIGHT", "IDEMPOTENCY_LEASE"}; !slices.Equal(names, want) {
		t.Errorf("refused %q, want %q", names, want)
	}
	if !strings.HasPrefix(err.Error(), "idempotency: invalid settings:\n") {
		t.Errorf("message %q does not start with the heading", err)
	}
}

// A nil settings change is skipped, as a nil option is in every package
// (docs/user-guide.md, "Options"), and the changes beside it still apply.
func TestNilSettingsOverridesAreSkipped(t *testing.T) {
	clearEnv(t)
	var s idempotency.Settings
	app := fxtest.New(t, fx.NopLogger, idempotency.Module,
		idempotency.OverrideSettings(nil),
		idempotency.OverrideSettingsWith[*testing.T](nil), // nothing in the graph provides a *testing.T
		idempotency.OverrideSettings(func(s *idempotency.Settings) { s.InFlight = coordinator.InFlightRaise }),
		fx.Populate(&s))
	if err := app.Err(); err != nil {
		t.Fatal(err)
	}
	if s.InFlight != coordinator.InFlightRaise {
		t.Fatalf("in-flight %v, want raise: the override beside the nil ones was lost", s.InFlight)
	}
}

// redisURLShapes are the URLs FuzzRedisURLErrorsHideThePassword puts a
// password (or, where password is false, a whole user information) into:
// valid ones and ones that fail in each place the parsers check.
var redisURLShapes = []struct {
	format   string
	password bool
}{
	{"redis://app:%s@127.0.0.1:6379/0", true},
	{"rediss://:%s@127.0.0.1:6380/1", true},
	{"redis://app:%s@127.0.0.1:6379/zero", true},               // database number
	{"redis://app:%s@127.0.0.1:6379/0?pool_size=x&db=3", true}, // a query option; db 3 on a cluster
	{"redis://app:%s@[::1", true},                              // host
	{"http://app:%s@127.0.0.1:6379", true},                     // scheme
	{"redis://%s@127.0.0.1:6379/0", false},                     // user name and password
	{"redis:%s@127.0.0.1:6379", false},                         // no //
}

// FuzzRedisURLErrorsHideThePassword puts a password into Redis URLs of every
// shape and checks that neither Settings.Validate's error nor
// NewRedisClient's (in single-server and cluster mode), nor Settings.String,
// contains three bytes in a row of it, as written or percent-decoded.
//
// An output may contain such bytes by chance, in its own words ("app" in a
// password and in the user name, "%25" in a hint): the bytes count as leaked
// only if the output for a disguised password (every letter, digit and
// non-ASCII byte replaced by another of its kind, so that the URL parses the
// same way) lacks them, and so do the fixed messages that replace a message
// that would show a part of the password (a password can make one appear by
// sharing bytes with a message it replaces: "tabuse" and "invalid database
// number").
func FuzzRedisURLErrorsHideThePassword(f *testing.F) {
	for _, seed := range []struct {
		password string
		shape    uint8
	}{
		{"p%zzss", 0}, // url.Parse: invalid URL escape "%zz"
		{"p%zzss", 8},
		{"p%zzss", 6},
		{"hunter2%4", 1},
		{"hunter2", 2},
		{"hunter2", 3},
		{"hunter2", 3 | 8},
		{"hunter2", 4},
		{"hunter2", 5},
		{"hunter2", 7},
		{"se/cret", 0}, // a '/' ends the host early
		{"1234/secret", 0},
		{"1234?secret", 0},
		{"sec#ret", 0},
		{"p@ss:w/rd", 0},
		{"pa%2Fss%40%3A", 8},
		{"database", 2},
		{"tabuse", 2}, // "tab" in "database": the fixed message, with "use" in "user name"
		{"%41%42%43%44", 0},
		{"über:geheim", 0},
	} {
		f.Add(seed.password, seed.shape)
	}
	var fixed strings.Builder // the fixed messages
	for _, raw := range []string{
		"redis://user:database@127.0.0.1:6379/x", // the reason is not shown
		"redis://user:p%zzss@127.0.0.1:6379/0",   // the escape
		"redis://user:a/b@127.0.0.1:6379/0",      // the ambiguous user information
	} {
		s := idempotency.DefaultSettings()
		s.RedisURL = raw
		fixed.WriteString(s.Validate().Error() + "\n")
	}
	f.Fuzz(func(t *testing.T, password string, shape uint8) {
		disguised := disguise(password)
		got, other := redisURLOutputs(password, shape), redisURLOutputs(disguised, shape)
		pieces := []string{password}
		if dec, err := url.PathUnescape(password); err == nil {
			pieces = append(pieces, dec)
		}
		for name, out := range got {
			for _, p := range pieces {
				for i := 0; i+3 <= len(p); i++ {
					if g := p[i : i+3]; strings.Contains(out, g) && !strings.Contains(other[name], g) && !strings.Contains(fixed.String(), g) {
						t.Fatalf("password %q in %q: %s shows %q:\n%s\n(with password %q:\n%s)",
							password, redisURLFor(password, shape), name, g, out, disguised, other[name])
					}
				}
			}
		}
	})
}

func redisURLFor(password string, shape uint8) string {
	return fmt.Sprintf(redisURLShapes[int(shape&7)%len(redisURLShapes)].format, password)
}

// redisURLOutputs returns what Validate, NewRedisClient and String say of the
// URL of shape with password; the bit 8 of shape selects cluster mode.
func redisURLOutputs(password string, shape uint8) map[string]string {
	s := idempotency.DefaultSettings()
	s.RedisURL = redisURLFor(password, shape)
	if shape&8 != 0 {
		s.RedisClusterAddrs = []string{"node-a:7000"}
	}
	out := map[string]string{}
	if err := s.Validate(); err != nil {
		out["Validate"] = err.Error()
	}
	client, err := idempotency.NewRedisClient(s)
	if err != nil {
		out["NewRedisClient"] = err.Error()
	} else {
		client.Close()
	}
	if redisURLShapes[int(shape&7)%len(redisURLShapes)].password {
		// String shows the user name, as url.URL.Redacted does.
		out["String"] = s.String()
	}
	return out
}

// disguise replaces every byte of password that is a hex letter, another
// letter, a digit or a non-ASCII byte with another of its kind, one that
// password does not use if there is one: the URL parses the same way, but
// shows other bytes wherever it shows the password.
func disguise(password string) string {
	classes := []string{"abcdef", "ABCDEF", "ghijklmnopqrstuvwxyz", "GHIJKLMNOPQRSTUVWXYZ", "0123456789"}
	var high []byte
	for b := 0x80; b <= 0xff; b++ {
		high = append(high, byte(b))
	}
	classes = append(classes, string(high))
	out := []byte(password)
	for _, class := range classes {
		sub := byte(0)
		for i := 0; i < len(class); i++ {
			if !strings.Contains(password, class[i:i+1]) {
				sub = class[i]
				break
			}
		}
		for i := range out {
			j := strings.IndexByte(class, password[i])
			if j < 0 {
				continue
			}
			if sub != 0 {
				out[i] = sub
			} else {
				out[i] = class[(j+1)%len(class)] // every one used: the next
			}
		}
	}
	return string(out)
}
