// Package redisurl parses the Redis URL of the IDEMPOTENCY_* settings
// without ever quoting its user name or password.
package redisurl

import (
	"errors"
	"fmt"
	"maps"
	"net"
	"net/url"
	"slices"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"
)

// envPrefix is idempotency.EnvPrefix, which names the variables in the
// messages.
const envPrefix = "IDEMPOTENCY"

// Topology says what kind of client the settings describe.
type Topology int

const (
	Server   Topology = iota // one server: RedisURL
	Cluster                  // RedisClusterAddrs is set
	Sentinel                 // RedisSentinelMaster is set
)

// Validate returns the error Parse returns for raw, if any.
func Validate(raw string, top Topology) error {
	_, err := Parse(raw, top)
	return err
}

// Parse returns the go-redis options of raw: a redis:// or rediss://
// URL that redis.ParseURL accepts. For a single server, it also refuses a
// URL without a host (go-redis would dial localhost) or with a port outside
// 1 to 65535, as ValidateHostPort refuses a seed node's. For a cluster
// (IDEMPOTENCY_REDIS_CLUSTER_ADDRS is set), it also refuses what a cluster
// client would ignore: a database other than 0, and a query option that the
// module's clusterOptions does not carry over
// (none in go-redis v9.23; the check keeps a later go-redis's new option from
// being dropped without a word). For a failover client
// (IDEMPOTENCY_REDIS_SENTINEL_MASTER is set), it refuses a query option that
// failoverOptions does not carry over, on the same grounds.
//
// Its messages never show the user name or the password, nor any part of
// them: they do not quote the URL, a URL whose user information cannot be
// located is refused with a fixed message, and a message that would quote
// three bytes in a row of it (from url.Parse or go-redis, or a value taken
// from the URL) is replaced by a fixed one.
func Parse(raw string, top Topology) (*redis.Options, error) {
	info, clear := Userinfo(raw)
	if info != "" && !clear {
		return nil, errors.New("the user name and password cannot be told apart from the rest of the URL, so it is not shown: " +
			"write redis://user:password@host:port/db, with any '/', '?' or '#' in the user name or password " +
			"percent-encoded (%2F, %3F, %23), and any '@' elsewhere as %40")
	}
	// hide returns err, or a fixed error when quoted, the parts of its
	// message that come from the URL, would show a part of info.
	hide := func(err error, quoted ...string) error {
		for _, q := range quoted {
			if info != "" && Mentions(q, info) {
				return errors.New("not a valid Redis URL (the reason is not shown: it would quote part of the user name or password)")
			}
		}
		return err
	}
	u, err := url.Parse(raw)
	if err != nil {
		// *url.Error quotes the whole URL; keep only the reason.
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		var ee url.EscapeError
		if errors.As(err, &ee) && info != "" && strings.Contains(info, string(ee)) {
			// "invalid URL escape "%zz"" would show a piece of the password.
			return nil, errors.New("not a valid URL: a '%' in the user name or password is not followed by two hex digits " +
				"(not shown; write a literal % as %25)")
		}
		return nil, hide(fmt.Errorf("not a valid URL: %w", err), err.Error())
	}
	if u.Scheme != "redis" && u.Scheme != "rediss" {
		if u.Scheme == "" {
			return nil, errors.New("want a redis:// or rediss:// URL, got no scheme")
		}
		return nil, hide(fmt.Errorf("want a redis:// or rediss:// URL, got scheme %q", u.Scheme), u.Scheme)
	}
	if u.Opaque != "" {
		// redis:localhost:6379 would connect to the default address.
		return nil, fmt.Errorf("want %s://host:port/db, got no // after the scheme", u.Scheme)
	}
	opts, err := redis.ParseURL(raw)
	if err != nil {
		return nil, hide(err, err.Error())
	}
	if opts.DB < 0 {
		return nil, hide(fmt.Errorf("database number must not be negative, got %d", opts.DB), strconv.Itoa(opts.DB))
	}
	switch top {
	case Server:
		if err := checkServerAddr(u); err != nil {
			return nil, hide(err, u.Port())
		}
		return opts, nil
	case Sentinel:
		for _, name := range slices.Sorted(maps.Keys(u.Query())) {
			if name != "db" && !appliesToCluster(name) {
				return nil, hide(fmt.Errorf("query option %s has no effect on a failover client (%s_REDIS_SENTINEL_MASTER is set)", name, envPrefix), name)
			}
		}
		return opts, nil
	}
	if opts.DB != 0 {
		return nil, hide(fmt.Errorf("database %d has no effect on a cluster client, which has database 0 only (%s_REDIS_CLUSTER_ADDRS is set)",
			opts.DB, envPrefix), strconv.Itoa(opts.DB))
	}
	for _, name := range slices.Sorted(maps.Keys(u.Query())) {
		if !appliesToCluster(name) {
			return nil, hide(fmt.Errorf("query option %s has no effect on a cluster client (%s_REDIS_CLUSTER_ADDRS is set)", name, envPrefix), name)
		}
	}
	return opts, nil
}

// checkServerAddr refuses the address of a single server's URL that
// redis.ParseURL would take without a word: no host, which it reads as
// localhost, or a port outside 1 to 65535, which no dial reaches. A URL
// without a port (redis://cache) means 6379, as go-redis reads it.
func checkServerAddr(u *url.URL) error {
	if u.Hostname() == "" {
		return errors.New("want redis://host:port/db with a host, got none (go-redis would dial localhost)")
	}
	if p := u.Port(); p != "" {
		if n, err := strconv.Atoi(p); err != nil || n < 1 || n > 65535 {
			return fmt.Errorf("port %q is not a number from 1 to 65535", p)
		}
	}
	return nil
}

// appliesToCluster reports whether the redis.ParseURL query option name
// reaches a cluster client: clusterOptions copies the fields it sets into
// redis.ClusterOptions. db is checked on its own (it must be 0).
func appliesToCluster(name string) bool {
	switch name {
	case "db",
		"protocol", "client_name",
		"max_retries", "min_retry_backoff", "max_retry_backoff",
		"dial_timeout", "read_timeout", "write_timeout",
		"pool_fifo", "pool_size", "pool_timeout", "max_concurrent_dials",
		"min_idle_conns", "max_idle_conns", "max_active_conns",
		"pipeline_pool_size", "pipeline_read_buffer_size", "pipeline_write_buffer_size",
		"conn_max_idle_time", "idle_timeout", // the second is the first's old name
		"conn_max_lifetime", "max_conn_age",
		"conn_max_lifetime_jitter",
		"skip_verify": // in TLSConfig
		return true
	}
	return false
}

// Userinfo returns the bytes of raw between "scheme://" and its last '@':
// the user name and password, percent-encoded, or "" when raw has no '@'.
// clear reports whether url.Parse reads exactly those bytes as the user
// information. It does not when a '/', '?' or '#' comes before the last '@'
// (a password with a '/' ends the host early, and the rest of the password
// would be read as a port or a path and be quoted in messages), or when raw
// does not start with a scheme and "//": then info is everything before the
// last '@', as any of it may be a password.
func Userinfo(raw string) (info string, clear bool) {
	at := strings.LastIndexByte(raw, '@')
	if at < 0 {
		return "", true
	}
	start := authorityStart(raw)
	if start > at {
		start = 0
	}
	info = raw[start:at]
	return info, start > 0 && !strings.ContainsAny(info, "/?#")
}

// authorityStart returns the index after "scheme://" at the start of raw, as
// url.Parse reads a scheme ([A-Za-z][A-Za-z0-9+.-]*), or 0.
func authorityStart(raw string) int {
	for i := 0; i < len(raw); i++ {
		switch c := raw[i]; {
		case 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z':
		case i > 0 && ('0' <= c && c <= '9' || c == '+' || c == '-' || c == '.'):
		case i > 0 && c == ':' && strings.HasPrefix(raw[i:], "://"):
			return i + len("://")
		default:
			return 0
		}
	}
	return 0
}

// Mentions reports whether msg contains three bytes in a row of info, as it
// is or percent-decoded.
func Mentions(msg, info string) bool {
	forms := []string{info}
	if dec, err := url.PathUnescape(info); err == nil && dec != info {
		forms = append(forms, dec)
	}
	for _, f := range forms {
		for i := 0; i+3 <= len(f); i++ {
			if strings.Contains(msg, f[i:i+3]) {
				return true
			}
		}
	}
	return false
}

// ValidateHostPort checks that addr is host:port with a host and a port
// from 1 to 65535.
func ValidateHostPort(addr string) error {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		var ae *net.AddrError
		if errors.As(err, &ae) {
			return fmt.Errorf("want host:port (%s)", ae.Err)
		}
		return fmt.Errorf("want host:port (%w)", err)
	}
	if host == "" || strings.ContainsFunc(host, func(r rune) bool { return r <= ' ' || r == 0x7f }) {
		return errors.New("want host:port with a host")
	}
	if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
		return fmt.Errorf("port %q is not a number from 1 to 65535", port)
	}
	return nil
}
