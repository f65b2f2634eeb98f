// Package sentinelcheck builds the failover client of a master that Redis
// Sentinel monitors, so that it never keeps a connection to a master that
// the sentinels have replaced while the connection was dialled.
//
// go-redis's failover client asks a sentinel for the master's address, and
// then dials it. When the sentinels fail the master over between the two,
// the client learns the new address (+switch-master) and closes its
// connections to the former master, and then the dial that got the former
// address switches the client back to it and adds a connection to it: calls
// reach the former master, which stays a writable master until the
// sentinels reconfigure it, and their records are lost when it becomes a
// replica (docs/reliability.md, finding 4). New adds a dial hook that asks
// the sentinels again once the connection is up and, when they name another
// master, closes it and dials again, which reaches the new one.
//
// What is left is a window of the check's own reply rather than of a dial:
// a connection that the sentinels confirmed just before they switched, and
// that joins the pool just after the client closed the former master's
// connections on the announcement, is kept.
package sentinelcheck

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync"

	"github.com/redis/go-redis/v9"
)

// ErrReplaced is the error (wrapped, with both addresses) of a dial whose
// master the sentinels replaced while it was dialled.
var ErrReplaced = errors.New("the sentinels named another master while the connection was dialled")

// New returns redis.NewFailoverClient(opts) with the dial hook that refuses
// a connection to a master that the sentinels no longer name. The hook asks
// the sentinels of opts.SentinelAddrs, from the one that answered last,
// with opts' sentinel credentials and TLS, over a connection of its own
// that it closes: one more round trip to a sentinel for each new
// connection to the master, which go-redis's pool makes only as it grows or
// replaces one. When no sentinel answers it keeps the connection, as
// go-redis would.
func New(opts *redis.FailoverOptions) *redis.Client {
	c := redis.NewFailoverClient(opts)
	c.AddHook(&hook{opts: *opts})
	return c
}

// hook is the dial hook of New.
type hook struct {
	opts redis.FailoverOptions

	mu    sync.Mutex
	first int // the sentinel that answered last, asked first
}

var _ redis.Hook = (*hook)(nil)

// DialHook refuses a connection whose address the sentinels no longer
// name as the master's, and dials again (go-redis's dial asks the sentinels
// afresh, and switches the client to their answer), a few times at most.
func (h *hook) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		for try := 1; ; try++ {
			conn, err := next(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			named, ok := h.master(ctx)
			if !ok || isAddr(ctx, conn.RemoteAddr(), named) {
				return conn, nil
			}
			_ = conn.Close()
			if try == maxDials {
				return nil, fmt.Errorf("redis: master %q at %s: %w (now %s), %d times", h.opts.MasterName, conn.RemoteAddr(), ErrReplaced, named, try)
			}
		}
	}
}

// maxDials bounds the dials of one connection: each refused one met a
// failover (or a sentinel whose answer changed) during it.
const maxDials = 3

// ProcessHook leaves commands alone.
func (h *hook) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }

// ProcessPipelineHook leaves pipelines alone.
func (h *hook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// master asks the sentinels for the master's address, from the one that
// answered last, and returns the first answer; ok is false when none
// answered.
func (h *hook) master(ctx context.Context) (addr string, ok bool) {
	h.mu.Lock()
	first := h.first
	h.mu.Unlock()
	n := len(h.opts.SentinelAddrs)
	for i := range n {
		i = (first + i) % n
		s := h.opts.SentinelAddrs[i]
		c := redis.NewSentinelClient(&redis.Options{
			Addr:                  s,
			Username:              h.opts.SentinelUsername,
			Password:              h.opts.SentinelPassword,
			TLSConfig:             h.opts.TLSConfig,
			DialTimeout:           h.opts.DialTimeout,
			DialerRetries:         1,
			MaxRetries:            -1,
			ContextTimeoutEnabled: true,
			PoolSize:              1,
		})
		hp, err := c.GetMasterAddrByName(ctx, h.opts.MasterName).Result()
		_ = c.Close()
		if err == nil && len(hp) == 2 {
			h.mu.Lock()
			h.first = i
			h.mu.Unlock()
			return net.JoinHostPort(hp[0], hp[1]), true
		}
		if ctx.Err() != nil {
			return "", false
		}
	}
	return "", false
}

// isAddr reports whether remote is the host:port named: the same IP and
// port, or, when named's host is a name, one of its IPs.
func isAddr(ctx context.Context, remote net.Addr, named string) bool {
	host, port, err := net.SplitHostPort(named)
	if err != nil {
		return false
	}
	tcp, ok := remote.(*net.TCPAddr)
	if !ok {
		return remote.String() == named
	}
	if strconv.Itoa(tcp.Port) != port {
		return false
	}
	if ip := net.ParseIP(host); ip != nil {
		return ip.Equal(tcp.IP)
	}
	ips, err := net.DefaultResolver.LookupIPAddr(ctx, host)
	if err != nil {
		return true // cannot tell: keep it, as go-redis would
	}
	for _, ip := range ips {
		if ip.IP.Equal(tcp.IP) {
			return true
		}
	}
	return false
}
