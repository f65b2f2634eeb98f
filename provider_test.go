package idempotency_test

import (
	"bytes"
	"crypto/tls"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idempotency"
)

func TestNewRedisClientTLS(t *testing.T) {
	s := idempotency.DefaultSettings()
	s.RedisURL = "rediss://app:secret@redis.example:6380/0"
	c, err := idempotency.NewRedisClient(s)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if got := c.(*redis.Client).Options().TLSConfig.ServerName; got != "redis.example" {
		t.Fatalf("standalone TLS server name = %q, want the URL's host", got)
	}

	s.RedisClusterAddrs = []string{"node-a:6379", "node-b:6379"}
	cc, err := idempotency.NewRedisClient(s)
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	opts := cc.(*redis.ClusterClient).Options()
	if opts.TLSConfig == nil || opts.TLSConfig.ServerName != "" || opts.Password != "secret" {
		t.Fatalf("cluster: TLS %+v, password %q; want TLS verifying each node by its own name and the URL's password", opts.TLSConfig, opts.Password)
	}
}

func TestNewRedisClientKeepsThePasswordOutOfErrors(t *testing.T) {
	s := idempotency.DefaultSettings()
	s.RedisURL = "redis://app:s3cret@cache:6379/zero"
	_, err := idempotency.NewRedisClient(s)
	if err == nil || !strings.Contains(err.Error(), "IDEMPOTENCY_REDIS_URL") || strings.Contains(err.Error(), "s3cret") {
		t.Fatalf("err = %v; want one naming the variable, without the password", err)
	}
}

// goRedisQueryOptions returns the query options that redis.ParseURL reads, as
// setupConnParams in the go-redis source this module builds with reads them,
// each with the kind of value it takes (int, string, duration or bool).
func goRedisQueryOptions(t *testing.T) map[string]string {
	t.Helper()
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "github.com/redis/go-redis/v9").Output()
	if err != nil {
		t.Fatalf("locating go-redis: %v", err)
	}
	src, err := os.ReadFile(filepath.Join(strings.TrimSpace(string(out)), "options.go"))
	if err != nil {
		t.Fatal(err)
	}
	body, ok := strings.CutPrefix(string(src[bytes.Index(src, []byte("\nfunc setupConnParams(")):]), "\n")
	if !ok {
		t.Fatal("no setupConnParams in go-redis's options.go")
	}
	body = body[:strings.Index(body, "\n}\n")]
	kinds := map[string]string{}
	for _, m := range regexp.MustCompile(`q\.(int|string|duration|bool|has|strings)\("([a-z_]+)"\)`).FindAllStringSubmatch(body, -1) {
		if m[1] != "has" || kinds[m[2]] == "" {
			kinds[m[2]] = m[1]
		}
	}
	if len(kinds) < 20 {
		t.Fatalf("found only %d query options in setupConnParams: %v", len(kinds), kinds)
	}
	return kinds
}

// Every query option that redis.ParseURL accepts either reaches the cluster
// client (its ClusterOptions carry every field the option sets on a
// single-server client) or is refused in cluster mode, naming it. The options
// are read from the go-redis source, so an option a later go-redis adds is
// covered without a change here.
func TestNewRedisClientClusterCarriesEveryQueryOption(t *testing.T) {
	checkQueryOptionsCarried(t, "cluster",
		func(raw string) idempotency.Settings {
			s := idempotency.DefaultSettings()
			s.RedisURL = raw
			s.RedisClusterAddrs = []string{"127.0.0.1:2"}
			return s
		},
		func(c redis.UniversalClient) reflect.Value {
			return reflect.ValueOf(*c.(*redis.ClusterClient).Options())
		},
		"IDEMPOTENCY_REDIS_URL: query option %s has no effect on a cluster client (IDEMPOTENCY_REDIS_CLUSTER_ADDRS is set)")
}

// checkQueryOptionsCarried checks, for every query option that redis.ParseURL
// reads, that the client NewRedisClient builds for settings(url with the
// option) carries every field the option sets on a single-server client
// (options returns the client's options struct), or that NewRedisClient and
// Validate both refuse it with refusal (a format naming the option).
func checkQueryOptionsCarried(t *testing.T, kind string, settings func(raw string) idempotency.Settings,
	options func(redis.UniversalClient) reflect.Value, refusal string) {
	t.Helper()
	const base = "redis://app:secret@127.0.0.1:1/0"
	baseOpts, err := redis.ParseURL(base)
	if err != nil {
		t.Fatal(err)
	}
	for name, valueKind := range goRedisQueryOptions(t) {
		t.Run(name, func(t *testing.T) {
			value := map[string]string{"int": "7", "string": "name7", "duration": "700ms", "bool": "true"}[valueKind]
			if value == "" {
				t.Fatalf("no test value for a %s option", valueKind)
			}
			raw, ref := base+"?"+name+"="+value, baseOpts
			switch name {
			case "db":
				if kind == "cluster" {
					t.Skip("a cluster has database 0 only: TestNewRedisClientClusterRefusesADatabase")
				}
				raw = base + "?db=7"
			case "skip_verify": // TLS only
				raw = strings.Replace(raw, "redis://", "rediss://", 1)
				if ref, err = redis.ParseURL(strings.Replace(base, "redis://", "rediss://", 1)); err != nil {
					t.Fatal(err)
				}
			case "conn_max_lifetime_jitter": // at most the lifetime
				raw += "&conn_max_lifetime=1h"
			}
			single, err := redis.ParseURL(raw)
			if err != nil {
				t.Fatalf("redis.ParseURL(%s): %v", raw, err)
			}
			s := settings(raw)
			client, err := idempotency.NewRedisClient(s)
			if err != nil {
				want := fmt.Sprintf(refusal, name)
				if err.Error() != want {
					t.Fatalf("NewRedisClient() error = %q; want it applied, or refused with %q", err, want)
				}
				if verr := s.Validate(); verr == nil || !strings.Contains(verr.Error(), want) {
					t.Fatalf("Validate() = %v; want it to refuse the option as NewRedisClient does", verr)
				}
				return
			}
			defer client.Close()
			got := options(client)
			refV, singleV := reflect.ValueOf(*ref), reflect.ValueOf(*single)
			set := 0
			for i := range singleV.NumField() {
				field := singleV.Type().Field(i)
				if !field.IsExported() || reflect.DeepEqual(refV.Field(i).Interface(), singleV.Field(i).Interface()) {
					continue
				}
				set++
				want := singleV.Field(i).Interface()
				if field.Name == "TLSConfig" {
					if g := got.FieldByName("TLSConfig").Interface().(*tls.Config); g == nil || g.InsecureSkipVerify != single.TLSConfig.InsecureSkipVerify {
						t.Errorf("%s TLSConfig = %+v; want InsecureSkipVerify %v", kind, g, single.TLSConfig.InsecureSkipVerify)
					}
					continue
				}
				g := got.FieldByName(field.Name)
				if !g.IsValid() {
					t.Errorf("%s sets Options.%s, which the %s client's options lack, yet NewRedisClient accepted it", name, field.Name, kind)
					continue
				}
				if !reflect.DeepEqual(g.Interface(), want) {
					t.Errorf("%s=%s: %s client's %s = %v, want %v", name, value, kind, field.Name, g.Interface(), want)
				}
			}
			if set == 0 {
				t.Fatalf("%s=%s sets no field of redis.Options; pick another test value", name, value)
			}
		})
	}
}

// The fields NewRedisClient sets itself reach the cluster client too.
func TestNewRedisClientClusterFailsFast(t *testing.T) {
	s := idempotency.DefaultSettings()
	s.StorageTimeout = 250 * time.Millisecond
	s.RedisClusterAddrs = []string{"127.0.0.1:2"}
	client, err := idempotency.NewRedisClient(s)
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	o := client.(*redis.ClusterClient).Options()
	if !o.ContextTimeoutEnabled || o.DialerRetries != 1 || o.DialTimeout != 5*time.Second {
		t.Fatalf("cluster options: ContextTimeoutEnabled %v, DialerRetries %d, DialTimeout %v; want true, 1, 5s (the lease, at most 5s)",
			o.ContextTimeoutEnabled, o.DialerRetries, o.DialTimeout)
	}
}

// A cluster has database 0 only: a URL that selects another is refused in
// cluster mode, by Validate (so at start-up) and NewRedisClient, rather than
// ignored.
func TestNewRedisClientClusterRefusesADatabase(t *testing.T) {
	for _, tt := range []struct {
		url     string
		wantErr string // "" accepted
	}{
		{url: "redis://cache:6379/0"},
		{url: "redis://cache:6379"},
		{url: "redis://cache:6379/?db=0"},
		{url: "redis://cache:6379/3", wantErr: "IDEMPOTENCY_REDIS_URL: database 3 has no effect on a cluster client, which has database 0 only (IDEMPOTENCY_REDIS_CLUSTER_ADDRS is set)"},
		{url: "redis://cache:6379/0?db=2", wantErr: "IDEMPOTENCY_REDIS_URL: database 2 has no effect on a cluster client, which has database 0 only (IDEMPOTENCY_REDIS_CLUSTER_ADDRS is set)"},
	} {
		s := idempotency.DefaultSettings()
		s.RedisURL = tt.url
		s.RedisClusterAddrs = []string{"node-a:7000"}
		client, err := idempotency.NewRedisClient(s)
		verr := s.Validate()
		if tt.wantErr == "" {
			if err != nil || verr != nil {
				t.Errorf("%s: NewRedisClient() error = %v, Validate() = %v; want neither", tt.url, err, verr)
			}
			if client != nil {
				client.Close()
			}
			continue
		}
		if err == nil || err.Error() != tt.wantErr {
			t.Errorf("%s: NewRedisClient() error = %v; want %q", tt.url, err, tt.wantErr)
		}
		if verr == nil || !strings.Contains(verr.Error(), "\n"+tt.wantErr) {
			t.Errorf("%s: Validate() = %v; want a line %q", tt.url, verr, tt.wantErr)
		}
		// A single server has databases: the same URL is fine there.
		s.RedisClusterAddrs = nil
		if err := s.Validate(); err != nil {
			t.Errorf("%s without a cluster: Validate() = %v", tt.url, err)
		}
	}
}

// No error and no printed Settings show any part of the user name or
// password, even of a URL so malformed that the parser cannot tell where they
// end; the errors still say what to fix. FuzzRedisURLErrorsHideThePassword
// tries many more.
func TestRedisURLErrorsHideTheUserInformation(t *testing.T) {
	for _, tt := range []struct {
		url, secret string
		wantErr     string // a part of the message
	}{
		// url.Parse: invalid URL escape "%zz"
		{url: "redis://user:p%zzss@host:6379/0", secret: "%zz", wantErr: "a '%' in the user name or password is not followed by two hex digits"},
		{url: "redis://u%zzq:pw@host:6379/0", secret: "%zz", wantErr: "a '%' in the user name or password is not followed by two hex digits"},
		{url: "redis://user:zqwvx%4@host:6379/0", secret: "%4", wantErr: "not followed by two hex digits"},
		// a '/' ends the host early: invalid port ":zq" after host
		{url: "redis://user:zq/wvx@host:6379/0", secret: "zq", wantErr: "cannot be told apart"},
		// ... or makes the rest a path: invalid database number "wvx@host:6379"
		{url: "redis://user:1234/wvx@host:6379", secret: "wvx", wantErr: "cannot be told apart"},
		// '?' and '#' likewise
		{url: "redis://user:1234?wvx@host:6379/0", secret: "wvx", wantErr: "percent-encoded (%2F, %3F, %23)"},
		{url: "redis://user:zq#wvx@host:6379/0", secret: "zq", wantErr: "cannot be told apart"},
		// no "//": all of it is opaque
		{url: "redis:user:zqwvx@host:6379/0", secret: "zqwvx", wantErr: "cannot be told apart"},
		// a message of go-redis that happens to share bytes with the password
		{url: "redis://user:database@host:6379/x", secret: "database", wantErr: "the reason is not shown"},
		// an invalid host is still named: it is not the user information
		{url: "redis://user:zqwvx@ho%zzst:6379/0", secret: "zqwvx", wantErr: `invalid URL escape "%zz"`},
	} {
		s := idempotency.DefaultSettings()
		s.RedisURL = tt.url
		verr := s.Validate()
		_, err := idempotency.NewRedisClient(s)
		if verr == nil || err == nil {
			t.Errorf("%s: Validate() = %v, NewRedisClient() error = %v; want errors", tt.url, verr, err)
			continue
		}
		for _, e := range []error{verr, err} {
			if strings.Contains(e.Error(), tt.secret) || !strings.Contains(e.Error(), "IDEMPOTENCY_REDIS_URL: ") || !strings.Contains(e.Error(), tt.wantErr) {
				t.Errorf("%s: error = %q; want one naming the variable and saying %q, without %q", tt.url, e, tt.wantErr, tt.secret)
			}
		}
		if got := s.String(); strings.Contains(got, tt.secret) {
			t.Errorf("%s: String() = %s", tt.url, got)
		}
	}
}

// A nil logger to NewObserver means what no logger in the graph means to
// Module: warnings and errors go to standard error (see stderrScenarios).
func TestNewObserverWithoutALoggerWritesToStderr(t *testing.T) {
	lines := runStderrScenario(t, "observer-nil-logger")
	if len(lines) != 1 || lines[0]["msg"] != "storage call failed" || lines[0]["level"] != "error" ||
		lines[0]["logger"] != "idempotency" || lines[0]["error_type"] != "storage_reserve_error" {
		t.Fatalf("stderr lines %v; want the storage error, and not the Debug line", lines)
	}
	if lines := runStderrScenario(t, "observer-nop-logger"); len(lines) != 0 {
		t.Fatalf("with zap.NewNop(), stderr lines %v; want none", lines)
	}
}

// redis:host:port has no "//": url.Parse reads it as opaque, and go-redis
// would connect to localhost:6379 instead.
func TestRedisURLWithoutSlashesIsRefused(t *testing.T) {
	s := idempotency.DefaultSettings()
	s.RedisURL = "redis:cache:6380"
	const want = "IDEMPOTENCY_REDIS_URL: want redis://host:port/db, got no // after the scheme"
	if err := s.Validate(); err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("Validate() = %v; want %q", err, want)
	}
	if _, err := idempotency.NewRedisClient(s); err == nil || err.Error() != want {
		t.Errorf("NewRedisClient() error = %v; want %q", err, want)
	}
}

func TestOldRedis(t *testing.T) {
	for _, tt := range []struct {
		info, version string
		old           bool
	}{
		{"# Server\r\nredis_version:7.0.15\r\nredis_git_sha1:0\r\n", "7.0.15", false},
		{"# Server\r\nredis_version:6.2.14\r\n", "6.2.14", true},
		{"redis_version:8.4.0", "8.4.0", false},
		{"redis_version:255.255.255", "255.255.255", false}, // miniredis
		{"# Server\r\nno version here\r\n", "", false},
		{"redis_version:x.y", "x.y", false},
	} {
		if v, old := idempotency.OldRedis(tt.info); v != tt.version || old != tt.old {
			t.Errorf("oldRedis(%q) = %q, %v; want %q, %v", tt.info, v, old, tt.version, tt.old)
		}
	}
}

// The dial timeout of the client NewRedisClient builds is the lease within
// [IDEMPOTENCY_STORAGE_TIMEOUT, 5s]; a dial_timeout in the URL is kept when it
// is shorter.
func TestNewRedisClientDialTimeout(t *testing.T) {
	for _, tt := range []struct {
		name           string
		url            string
		lease, storage time.Duration
		want           time.Duration
	}{
		{"defaults", "redis://127.0.0.1:2/0", 30 * time.Second, 250 * time.Millisecond, 5 * time.Second},
		{"a short lease", "redis://127.0.0.1:2/0", time.Second, 100 * time.Millisecond, time.Second},
		{"a lease shorter than the storage timeout", "redis://127.0.0.1:2/0", 50 * time.Millisecond, 100 * time.Millisecond, 100 * time.Millisecond},
		{"a shorter dial_timeout in the URL", "redis://127.0.0.1:2/0?dial_timeout=200ms", 30 * time.Second, 250 * time.Millisecond, 200 * time.Millisecond},
		{"a longer dial_timeout in the URL", "redis://127.0.0.1:2/0?dial_timeout=1m", 30 * time.Second, 250 * time.Millisecond, 5 * time.Second},
	} {
		t.Run(tt.name, func(t *testing.T) {
			s := idempotency.DefaultSettings()
			s.RedisURL, s.Lease, s.StorageTimeout = tt.url, tt.lease, tt.storage
			client, err := idempotency.NewRedisClient(s)
			if err != nil {
				t.Fatal(err)
			}
			defer client.Close()
			if got := client.(*redis.Client).Options().DialTimeout; got != tt.want {
				t.Errorf("DialTimeout = %v; want %v", got, tt.want)
			}
		})
	}
}
