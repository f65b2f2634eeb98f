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

// A single server's URL needs a host and a port from 1 to 65535, as a
// seed node's host:port does: go-redis would take the others without a
// word, and dial localhost or nothing. No message quotes the password.
func TestParseChecksTheServersAddress(t *testing.T) {
	const secret = "s3cret-99999"
	tests := []struct {
		raw  string
		want string // "": accepted
	}{
		{raw: "redis://cache:6379/0"},
		{raw: "redis://cache/0"},
		{raw: "redis://cache:/0"},
		{raw: "rediss://user:" + secret + "@cache:6380/2"},
		{raw: "redis://[::1]:6379/0"},
		{raw: "redis://cache:1/0"},
		{raw: "redis://cache:65535/0"},
		{raw: "redis://cache:99999/0", want: `port "99999" is not a number from 1 to 65535`},
		{raw: "redis://cache:65536/0", want: `port "65536" is not a number from 1 to 65535`},
		{raw: "redis://cache:0/0", want: `port "0" is not a number from 1 to 65535`},
		{raw: "redis://:6379/0", want: "want redis://host:port/db with a host, got none"},
		{raw: "redis:///0", want: "want redis://host:port/db with a host, got none"},
		{raw: "redis://user:" + secret + "@:6379/0", want: "want redis://host:port/db with a host, got none"},
		{raw: "redis://user:" + secret + "@cache:0/0", want: `port "0" is not a number from 1 to 65535`},
		// The port is part of the password: the reason is not shown.
		{raw: "redis://user:" + secret + "@cache:99999/0", want: "the reason is not shown"},
	}
	for _, tt := range tests {
		t.Run(tt.raw, func(t *testing.T) {
			_, err := redisurl.Parse(tt.raw, redisurl.Server)
			switch {
			case tt.want == "" && err != nil:
				t.Fatalf("Parse = %v, want it accepted", err)
			case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
				t.Fatalf("Parse = %v, want an error containing %q", err, tt.want)
			case err != nil && strings.Contains(tt.raw, secret) && redisurl.Mentions(err.Error(), secret):
				t.Fatalf("Parse = %v: it quotes part of the password", err)
			}
		})
	}
	// A cluster's or a failover client's URL host is ignored: not checked.
	for _, top := range []redisurl.Topology{redisurl.Cluster, redisurl.Sentinel} {
		if _, err := redisurl.Parse("redis://:secret@/0", top); err != nil {
			t.Errorf("Parse(no host, %v) = %v, want nil: the host is ignored", top, err)
		}
	}
}
