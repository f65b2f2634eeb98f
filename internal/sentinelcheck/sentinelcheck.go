// Package sentinelcheck builds the failover client of a master that Redis
// Sentinel monitors, so that no connection it adds to its pool sends a
// byte to a master that the sentinels have replaced.
//
// go-redis's failover client asks a sentinel for the master's address, and
// then dials it. When the sentinels fail the master over between the two,
// the client learns the new address (+switch-master) and closes its
// connections to the former master, and then the dial that got the former
// address switches the client back to it and adds a connection to it: calls
// reach the former master, which stays a writable master until the
// sentinels reconfigure it, and their records are lost when it becomes a
// replica (docs/reliability.md, finding 4).
//
// New wraps each connection the client dials so that its first write asks
// the sentinels once more whether its address is still the master's. By
// then the connection is in go-redis's pool, so a failover announced after
// the sentinels' answer closes it with the others; one announced before is
// in the answer. A connection whose master was replaced is closed before
// it sends anything, and the write fails as a dial does, which go-redis
// retries on a new connection (unless MaxRetries is -1).
package sentinelcheck

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
)

// ErrReplaced is the error (wrapped, with a *net.OpError of Op "dial", which
// go-redis retries) of a connection whose master the sentinels replaced
// before it sent anything.
var ErrReplaced = errors.New("the sentinels named another master")

// New returns redis.NewFailoverClient(opts) with the dial hook that makes
// each connection confirm its master before it sends anything. The check
// asks the sentinels of opts.SentinelAddrs, from the one that answered
// last, with opts' sentinel credentials and TLS, over a connection of its
// own that it closes: one more round trip to a sentinel for each new
// connection to the master, which go-redis's pool makes only as it grows
// or replaces one. It waits until the write's deadline, or DialTimeout
// when the write has none. When no sentinel answers it keeps the
// connection, as go-redis would.
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

// DialHook wraps each connection so that its first write confirms it.
func (h *hook) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		conn, err := next(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		c := &checkedConn{Conn: conn, h: h}
		if _, ok := conn.(syscall.Conn); ok {
			// go-redis's pool checks an idle connection's socket
			// through syscall.Conn, and skips the check without it.
			return sysCheckedConn{c}, nil
		}
		return c, nil
	}
}

// ProcessHook leaves commands alone.
func (h *hook) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }

// ProcessPipelineHook leaves pipelines alone.
func (h *hook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// checkedConn is a connection to the master that asks the sentinels, at
// its first write, whether its address is still the master's.
type checkedConn struct {
	net.Conn
	h *hook

	confirmed atomic.Bool
	deadline  atomic.Int64 // the write deadline go-redis set, in UnixNano; 0 for none
}

// sysCheckedConn is a checkedConn whose socket go-redis can inspect.
type sysCheckedConn struct{ *checkedConn }

// SyscallConn returns the socket's, for go-redis's health check of an idle
// connection, which peeks without reading.
func (c sysCheckedConn) SyscallConn() (syscall.RawConn, error) {
	return c.Conn.(syscall.Conn).SyscallConn()
}

// Write confirms the connection's master first, once.
func (c *checkedConn) Write(b []byte) (int, error) {
	if !c.confirmed.Load() {
		if err := c.confirm(); err != nil {
			_ = c.Conn.Close()
			return 0, err
		}
		c.confirmed.Store(true)
	}
	return c.Conn.Write(b)
}

// confirm returns an error wrapping a *net.OpError of Op "dial" and
// ErrReplaced when the sentinels name another master than the
// connection's.
func (c *checkedConn) confirm() error {
	ctx, cancel := c.checkContext()
	defer cancel()
	named, ok := c.h.master(ctx)
	if !ok || isAddr(ctx, c.Conn.RemoteAddr(), named) {
		return nil
	}
	// Wrapped once more, since go-redis unwraps a failed handshake's
	// error once before it decides on a retry.
	return fmt.Errorf("sentinelcheck: %w", &net.OpError{Op: "dial", Net: c.Conn.RemoteAddr().Network(), Source: c.Conn.LocalAddr(), Addr: c.Conn.RemoteAddr(),
		Err: fmt.Errorf("redis master %q: %w (now %s)", c.h.opts.MasterName, ErrReplaced, named)})
}

// checkContext bounds the check by the write's deadline, or DialTimeout.
func (c *checkedConn) checkContext() (context.Context, context.CancelFunc) {
	if d := c.deadline.Load(); d != 0 {
		return context.WithDeadline(context.Background(), time.Unix(0, d))
	}
	timeout := c.h.opts.DialTimeout
	if timeout <= 0 {
		timeout = defaultDialTimeout
	}
	return context.WithTimeout(context.Background(), timeout)
}

// defaultDialTimeout is go-redis's default DialTimeout.
const defaultDialTimeout = 5 * time.Second

// SetDeadline records the write deadline for the check.
func (c *checkedConn) SetDeadline(t time.Time) error {
	c.setDeadline(t)
	return c.Conn.SetDeadline(t)
}

// SetWriteDeadline records the write deadline for the check.
func (c *checkedConn) SetWriteDeadline(t time.Time) error {
	c.setDeadline(t)
	return c.Conn.SetWriteDeadline(t)
}

func (c *checkedConn) setDeadline(t time.Time) {
	var d int64
	if !t.IsZero() {
		d = t.UnixNano()
	}
	c.deadline.Store(d)
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
