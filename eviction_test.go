package idempotency_test

import (
	"strconv"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idempotency/internal/redistest"
)

// A Redis whose maxmemory-policy can evict records fails start-up, naming
// the setting and the variable that accepts it; noeviction starts; with
// that variable set the error is a warning.
func TestModuleStartUpRefusesAnEvictingRedis(t *testing.T) {
	for _, tc := range []struct {
		policy string
		allow  bool
		want   string // in the error; "" means start-up succeeds
		warn   string // in a warning, when set
	}{
		{"noeviction", false, "", ""},
		{"allkeys-lru", false, "maxmemory-policy allkeys-lru", ""},
		{"allkeys-random", false, "maxmemory-policy allkeys-random", ""},
		{"volatile-ttl", false, "maxmemory-policy volatile-ttl", ""},
		{"volatile-lfu", false, "maxmemory-policy volatile-lfu", ""},
		{"allkeys-lru", true, "", "can evict records"},
	} {
		t.Run(tc.policy+"/allow="+strconv.FormatBool(tc.allow), func(t *testing.T) {
			addr := "127.0.0.1:" + strconv.Itoa(redisProc(t, "--maxmemory-policy", tc.policy))
			logs, err := startModule(t, map[string]string{
				"IDEMPOTENCY_REDIS_URL":            "redis://" + addr + "/0",
				"IDEMPOTENCY_REDIS_ALLOW_EVICTION": strconv.FormatBool(tc.allow),
			})
			if tc.want == "" {
				if err != nil {
					t.Fatalf("start-up failed: %v", err)
				}
			} else {
				if err == nil {
					t.Fatalf("start-up succeeded, want %q", tc.want)
				}
				t.Log(err)
				for _, part := range []string{"IDEMPOTENCY_REDIS_ALLOW_EVICTION: redis at " + addr, tc.want, "noeviction", "IDEMPOTENCY_REDIS_ALLOW_EVICTION=true"} {
					if !strings.Contains(err.Error(), part) {
						t.Fatalf("err = %v, want %q in it", err, part)
					}
				}
			}
			warned := logs.FilterMessageSnippet("maxmemory-policy").Len() > 0
			if tc.warn != "" && logs.FilterMessageSnippet(tc.warn).Len() != 1 {
				t.Errorf("warnings %v, want one that says %q", logs.All(), tc.warn)
			}
			if tc.warn == "" && tc.want == "" && warned {
				t.Errorf("a noeviction server warned: %v", logs.All())
			}
		})
	}
}

// A user that may not run CONFIG (as managed Redis often has it) starts,
// with a warning that gives the advice.
func TestModuleStartUpWarnsWhenConfigIsRefused(t *testing.T) {
	const secret = "evict-s3cret"
	addr := "127.0.0.1:" + strconv.Itoa(redisProc(t, "--requirepass", secret, "--maxmemory-policy", "allkeys-lru"))
	admin := redis.NewClient(&redis.Options{Addr: addr, Password: secret})
	t.Cleanup(func() { _ = admin.Close() })
	if err := admin.Do(t.Context(), "ACL", "SETUSER", "app", "on", ">"+secret+"-app", "~*", "&*", "+@all", "-config").Err(); err != nil {
		t.Fatal(err)
	}
	logs, err := startModule(t, map[string]string{"IDEMPOTENCY_REDIS_URL": "redis://app:" + secret + "-app@" + addr + "/0"})
	if err != nil {
		t.Fatalf("start-up failed: %v", err)
	}
	if n := logs.FilterMessageSnippet("could not read the server's maxmemory-policy").Len(); n != 1 {
		t.Errorf("warnings %v, want one about maxmemory-policy", logs.All())
	}
}

// On a cluster every master is read: one evicting master fails start-up,
// naming it.
func TestModuleStartUpReadsEveryClusterMaster(t *testing.T) {
	c := redistest.NewCluster(t, 3)
	nodes := c.Nodes()
	evicting := nodes[len(nodes)-1].Addr()
	node := redis.NewClient(&redis.Options{Addr: evicting})
	t.Cleanup(func() { _ = node.Close() })
	if err := node.ConfigSet(t.Context(), "maxmemory-policy", "volatile-lru").Err(); err != nil {
		t.Fatal(err)
	}
	_, err := startModule(t, map[string]string{"IDEMPOTENCY_REDIS_CLUSTER_ADDRS": strings.Join(c.Addrs(), ",")})
	if err == nil || !strings.Contains(err.Error(), "redis at "+evicting+" has maxmemory-policy volatile-lru") {
		t.Fatalf("start-up on a cluster with one volatile-lru master: %v, want an error naming %s", err, evicting)
	}
}

// With replica acknowledgement on, a server with fewer connected replicas
// than it needs starts, with a warning; WAITAOF on a server without it, or
// with appendonly no, fails start-up naming IDEMPOTENCY_REDIS_REPLICA_ACK_FSYNC.
func TestModuleStartUpChecksReplicaAcks(t *testing.T) {
	addr := "127.0.0.1:" + strconv.Itoa(redisProc(t))
	logs, err := startModule(t, map[string]string{"IDEMPOTENCY_REDIS_URL": "redis://" + addr + "/0", "IDEMPOTENCY_REDIS_REPLICA_ACKS": "1"})
	if err != nil {
		t.Fatalf("start-up with 1 acknowledgement and no replica: %v", err)
	}
	if n := logs.FilterMessageSnippet("fewer replicas are connected").Len(); n != 1 {
		t.Errorf("warnings %v, want one about the missing replica", logs.All())
	}
	_, err = startModule(t, map[string]string{"IDEMPOTENCY_REDIS_URL": "redis://" + addr + "/0", "IDEMPOTENCY_REDIS_REPLICA_ACK_FSYNC": "true"})
	if err == nil || !strings.HasPrefix(err.Error(), "IDEMPOTENCY_REDIS_REPLICA_ACK_FSYNC: redis at "+addr) ||
		!(strings.Contains(err.Error(), "no WAITAOF") || strings.Contains(err.Error(), "appendonly no")) {
		t.Fatalf("start-up with WAITAOF on a server without it or without appendonly: %v", err)
	}
}
