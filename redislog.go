package idempotency

import (
	"context"
	"fmt"
	"log"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/logging"
	"go.uber.org/zap"
)

// RedisLogsMode says where go-redis's own log lines go: the lines the Redis
// client library prints itself, such as a sentinel's "new master" or a
// connection pool's failed dial, which go-redis writes to standard error,
// unstructured, unless told otherwise. Set it with IDEMPOTENCY_REDIS_LOGS.
// The zero value means RedisLogsZap.
//
// go-redis has one logger per process (redis.SetLogger), not one per
// client, so the mode applies to every go-redis client in the process, the
// app's own too, and the last app to start decides. An app that sets
// go-redis's logger itself should choose RedisLogsKeep.
type RedisLogsMode string

// The go-redis log modes.
const (
	// RedisLogsZap sends go-redis's lines to the module's logger (the app's
	// *zap.Logger, or the module's standard error logger), named
	// "go-redis": a line that reports a failure at level Warn, any other at
	// Info. The default.
	RedisLogsZap RedisLogsMode = "zap"
	// RedisLogsOff discards go-redis's lines (logging.VoidLogger). Every
	// failed store call is still logged by the module itself.
	RedisLogsOff RedisLogsMode = "off"
	// RedisLogsKeep leaves go-redis's logger as it is: go-redis's own
	// standard error logger, or the one the app set.
	RedisLogsKeep RedisLogsMode = "keep"
)

// parse returns the mode m names, with "" meaning RedisLogsZap.
func (m RedisLogsMode) parse() (RedisLogsMode, error) {
	switch m {
	case "", RedisLogsZap:
		return RedisLogsZap, nil
	case RedisLogsOff, RedisLogsKeep:
		return m, nil
	}
	return "", fmt.Errorf("unknown go-redis log mode %q: accepted values are zap, off, keep", string(m))
}

// String returns the mode's name; the zero value prints as "zap".
func (m RedisLogsMode) String() string {
	if m == "" {
		return string(RedisLogsZap)
	}
	return string(m)
}

// UnmarshalText parses "zap", "off" or "keep"; empty text means "zap". It
// returns an error naming the accepted values for anything else.
func (m *RedisLogsMode) UnmarshalText(b []byte) error {
	v, err := RedisLogsMode(b).parse()
	if err != nil {
		return err
	}
	*m = v
	return nil
}

// MarshalText returns the mode's name.
func (m RedisLogsMode) MarshalText() ([]byte, error) { return []byte(m.String()), nil }

// SetRedisLogger points go-redis's process-wide logger (redis.SetLogger) where
// mode says: to logger for RedisLogsZap (or ""), nowhere for RedisLogsOff;
// RedisLogsKeep leaves it alone. Module calls it on start with its settings'
// RedisLogs and its logger, and detach on stop; call it yourself when you use
// the library without fx.
//
// detach stops the lines going to logger (a logger that belongs to a stopped
// app, or to a finished test, must not be written to): go-redis's lines then
// go to standard error, as go-redis prints them by default, until someone
// sets go-redis's logger again. It does nothing for the other modes, and
// nothing the second time. SetRedisLogger returns an error naming the
// accepted values for an unknown mode, and changes nothing then.
func SetRedisLogger(mode RedisLogsMode, logger *zap.Logger) (detach func(), err error) {
	m, err := mode.parse()
	if err != nil {
		return nil, err
	}
	switch m {
	case RedisLogsZap:
		z := &zapRedisLogger{}
		z.l.Store(logger.Named("go-redis").WithOptions(zap.AddCallerSkip(1)))
		redis.SetLogger(z)
		return func() { z.l.Store(nil) }, nil
	case RedisLogsOff:
		redis.SetLogger(&logging.VoidLogger{})
	}
	return func() {}, nil
}

// zapRedisLogger is go-redis's logging interface over a *zap.Logger, or, once
// detached (l is nil), over standard error as go-redis's default logger
// writes.
type zapRedisLogger struct {
	l atomic.Pointer[zap.Logger]

	mu       sync.Mutex
	last     string    // the last failure line logged at Warn
	lastAt   time.Time // when
	repeated int       // how often it came again since, logged at Debug
}

// redisLogRepeatWindow is how long a failure line of go-redis that repeats
// the last one (a failed dial, for each attempt of each call while Redis is
// down) is logged at Debug instead of Warn.
const redisLogRepeatWindow = 10 * time.Second

// repeat reports whether msg, a failure line, repeats the last one logged
// at Warn within redisLogRepeatWindow; if not, it returns how often the line
// came again since it was last logged at Warn (0 for a new line).
func (z *zapRedisLogger) repeat(msg string) (bool, int) {
	z.mu.Lock()
	defer z.mu.Unlock()
	now := time.Now()
	if msg == z.last && now.Sub(z.lastAt) < redisLogRepeatWindow {
		z.repeated++
		return true, 0
	}
	n := 0
	if msg == z.last {
		n = z.repeated
	}
	z.last, z.lastAt, z.repeated = msg, now, 0
	return false, n
}

// Printf logs one go-redis line: at Warn when it reports a failure, else at
// Info. A failure line that repeats the last one within 10s (each failed dial
// of each call while Redis is down, or of a circuit breaker's probes) is
// logged at Debug; when it comes again after that, at Warn, its "repeated"
// field says how often it came in between. go-redis's lines are free text without a level, so a failure is told
// by its words: those go-redis v9.23's failure lines use (failed, error,
// err=, bad, discarding, unable, timeout, refused).
func (z *zapRedisLogger) Printf(_ context.Context, format string, v ...any) {
	msg := fmt.Sprintf(format, v...)
	l := z.l.Load()
	switch {
	case l == nil:
		_ = stderrRedisLog.Output(2, msg)
	case failureLine(msg):
		switch again, n := z.repeat(msg); {
		case again:
			l.Debug(msg)
		case n > 0:
			l.Warn(msg, zap.Int("repeated", n))
		default:
			l.Warn(msg)
		}
	default:
		l.Info(msg)
	}
}

// stderrRedisLog writes as go-redis's default logger does.
var stderrRedisLog = log.New(os.Stderr, "redis: ", log.LstdFlags)

func failureLine(msg string) bool {
	lower := strings.ToLower(msg)
	for _, w := range []string{"fail", "error", "err=", "bad", "discard", "unable", "timeout", "refused"} {
		if strings.Contains(lower, w) {
			return true
		}
	}
	return false
}
