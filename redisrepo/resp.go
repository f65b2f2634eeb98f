package redisrepo

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"
)

// errWrongType is the WRONGTYPE error reply: the key holds another Redis
// type than the command reads (for a record: a format 1 HASH).
var errWrongType = errors.New("redisrepo: WRONGTYPE")

// bulk sends a command whose reply is a bulk string or null (GET, SET NX
// GET, watch.lua) and returns the string, or found false for null. It reads
// the reply raw: go-redis turns a null reply into the error redis.Nil, and
// spends some twenty allocations deciding whether to retry it, on every
// first run. An error reply is returned as errWrongType, as a replyErr when
// it is final (see final), or else sent again as a parsed command, so that
// go-redis follows a cluster redirection (MOVED, ASK, with ASKING) or
// retries what it retries (LOADING, TRYAGAIN...), and returns what that
// gives; a resharding reply that outlasts go-redis's tries, or a refused
// connection on a cluster, is ridden through (see rideThrough). An EVALSHA
// of a hot script that meets NOSCRIPT is sent again as an EVAL of its text
// (see hotScript). The string aliases the reply, which has no other user.
func (s *Store) bulk(ctx context.Context, args ...any) (v []byte, found bool, err error) {
	raw := redis.NewRawCmd(ctx, args...)
	if err := s.send(ctx, raw); err != nil {
		if clusterRetry(s.client, err) { // a removed node's address: never sent
			return s.parsed(ctx, args)
		}
		return nil, false, err
	}
	b := raw.Val()
	if len(b) < 3 || b[len(b)-2] != '\r' || b[len(b)-1] != '\n' {
		return nil, false, fmt.Errorf("redisrepo: invalid reply %q", b)
	}
	switch b[0] {
	case '$':
		i := bytes.IndexByte(b, '\r')
		n, err := strconv.Atoi(string(b[1:i]))
		switch {
		case err != nil:
			return nil, false, fmt.Errorf("redisrepo: invalid reply %q", b)
		case n == -1:
			return nil, false, nil
		case n < 0 || len(b) != i+2+n+2:
			return nil, false, fmt.Errorf("redisrepo: invalid reply %q", b)
		}
		return b[i+2 : i+2+n : i+2+n], true, nil
	case '_':
		return nil, false, nil
	case '-', '!':
		if bytes.HasPrefix(b[1:], []byte("WRONGTYPE")) {
			return nil, false, errWrongType
		}
		if bytes.HasPrefix(b[1:], []byte("NOSCRIPT")) {
			if e := evalArgs(args); e[0] == argEval {
				return s.bulk(ctx, e...)
			}
		}
		if final(b[1:]) {
			return nil, false, replyErr(b[1 : len(b)-2])
		}
		if r, ok := s.client.(reloader); ok && bytes.HasPrefix(b[1:], []byte("MOVED ")) {
			// go-redis does not see a raw reply's MOVED, so it would not
			// reload its stale slot map, and every call on the slot would
			// pay this second round trip until the periodic reload.
			r.ReloadState(ctx)
		}
		return s.parsed(ctx, args)
	default:
		return nil, false, fmt.Errorf("redisrepo: unexpected reply %q", b)
	}
}

// parsed sends args as a parsed command: the slow path of bulk, after an
// error reply. It rides through a resharding (see Store.process): go-redis
// follows a redirection a few times only, and a raw reply not at all.
func (s *Store) parsed(ctx context.Context, args []any) ([]byte, bool, error) {
	v, err := s.run(ctx, args) // EVAL after NOSCRIPT: redirected to a server that lacks the script
	switch {
	case errors.Is(err, redis.Nil):
		return nil, false, nil
	case isReplyError(err, "WRONGTYPE"):
		return nil, false, errWrongType
	case err != nil:
		return nil, false, err
	}
	str, ok := v.(string)
	if !ok {
		return nil, false, fmt.Errorf("redisrepo: unexpected reply %T", v)
	}
	return []byte(str), true, nil
}

// final reports whether the error reply line b (without its "-") is a
// refusal that go-redis neither redirects nor retries: sending it again
// parsed would only cost a round trip. READONLY is not final: go-redis
// retries it (a failover in progress).
func final(b []byte) bool {
	for _, code := range refusals {
		if code != "READONLY " && bytes.HasPrefix(b, []byte(code)) {
			return true
		}
	}
	return false
}

// replyErr is an error reply of Redis, read raw: a redis.Error.
type replyErr string

func (e replyErr) Error() string { return string(e) }

// RedisError marks replyErr as a redis.Error.
func (replyErr) RedisError() {}

// refusals are the error codes with which Redis refuses a write that it
// would serve as a read: OOM (maxmemory reached, policy noeviction),
// READONLY (a replica), MISCONF (a failed RDB snapshot with
// stop-writes-on-bgsave-error) and NOREPLICAS (min-replicas-to-write not
// met).
var refusals = [...]string{"OOM ", "READONLY ", "MISCONF ", "NOREPLICAS "}

// writeRefused reports whether err is an error reply that refuses a write
// only: reads of the same server still work.
func writeRefused(err error) bool {
	for _, code := range refusals {
		if isReplyError(err, code) {
			return true
		}
	}
	return false
}

// isReplyError reports whether err is an error reply of Redis that starts
// with prefix (its error code, as WRONGTYPE, or more). A nil err returns at
// once: errors.As would cost an allocation on every successful call.
func isReplyError(err error, prefix string) bool {
	if err == nil {
		return false
	}
	var re redis.Error
	return errors.As(err, &re) && strings.HasPrefix(re.Error(), prefix)
}
