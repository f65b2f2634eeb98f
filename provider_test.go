package idempotency_test

import (
	"strings"
	"testing"

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
