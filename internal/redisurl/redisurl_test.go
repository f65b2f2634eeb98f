package redisurl_test

import (
	"strings"
	"testing"

	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/internal/redisurl"
)

// The messages name the module's variables: the prefix here is the
// module's EnvPrefix.
func TestMessagesNameTheModulesVariables(t *testing.T) {
	_, err := redisurl.Parse("redis://localhost:6379/0?pool_fifo=true&unknown_option=1", redisurl.Sentinel)
	if err == nil {
		t.Fatal("Parse accepted an option a failover client would drop")
	}
	_, err = redisurl.Parse("redis://localhost:6379/2", redisurl.Cluster)
	if err == nil || !strings.Contains(err.Error(), idempotency.EnvPrefix+"_REDIS_CLUSTER_ADDRS") {
		t.Fatalf("Parse(db 2, Cluster) = %v, want an error naming %s_REDIS_CLUSTER_ADDRS", err, idempotency.EnvPrefix)
	}
}
