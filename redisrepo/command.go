package redisrepo

import (
	"crypto/sha1"
	"encoding/hex"
	"unsafe"

	"github.com/idemkit/idempotency/coordinator/idemstore"
)

// command is the arguments of one command of the common paths (a
// reservation, a completion, a renewal, a release) in one allocation: the
// argument list, and the strings it names (the record's key, its value, the
// stored token, the wake-up channel), written into buf and passed as
// *string, which go-redis writes as it writes a string. Boxing a string or a
// []byte in an interface costs an allocation each; a pointer costs none. A
// command is never reused: go-redis may still read its arguments after a
// call returns (an AutoPipeliner's batch, after a timeout), so nothing in it
// changes once it is sent.
type command struct {
	args [10]any
	n    int
	buf  [256]byte
	used int

	key, val, token, channel, result string
}

// newCommand returns a command on the Redis key of key.
func (s *Store) newCommand(key idemstore.Key) *command {
	c := &command{}
	b := append(c.buf[:0], s.prefix...)
	b = append(b, key.Operation...)
	b = append(b, ':')
	b = append(b, key.Key...)
	c.key = c.keep(b)
	return c
}

// keep returns b, which was appended to c.free(), as a string, and marks it
// used. b may have outgrown buf: it is then memory of its own, never changed
// either.
func (c *command) keep(b []byte) string {
	if len(b) == 0 {
		return ""
	}
	if unsafe.SliceData(b) == unsafe.SliceData(c.free()) {
		c.used += len(b)
	}
	return unsafe.String(unsafe.SliceData(b), len(b))
}

// decode reads v, a record's value, as decodeValue does, and spells its
// packed fields into buf's unused part when they fit: the record's token
// and fingerprint then alias buf, which nothing writes again.
func (c *command) decode(v []byte) idemstore.Record {
	rec, n := decodeValueIn(v, c.free())
	c.used += n
	return rec
}

// free returns the unused part of buf, empty, to append to.
func (c *command) free() []byte { return c.buf[c.used:c.used:len(c.buf)] }

// add appends args to the argument list.
func (c *command) add(args ...any) {
	if c.n+len(args) > len(c.args) {
		panic("redisrepo: a command with more arguments than command.args holds")
	}
	c.n += copy(c.args[c.n:], args)
}

// list returns the argument list.
func (c *command) list() []any { return c.args[:c.n:c.n] }

// setToken stores token as a version 2 record stores it (see storedToken).
func (c *command) setToken(token string) {
	b, packed := appendStoredToken(c.free(), token)
	if !packed {
		c.token = token
		return
	}
	c.token = c.keep(b)
}

// setChannel stores the wake-up channel of the command's key.
func (c *command) setChannel(s *Store) {
	if !s.sharded {
		c.channel = s.channel
		return
	}
	c.channel = c.keep(s.appendShardChannel(c.free(), c.key))
}

// hotScript is a script of the common paths, run with EVALSHA: Redis does
// not hash and parse the whole text on every call. After NOSCRIPT (a
// restart, a failover, SCRIPT FLUSH: a server whose script cache lost it)
// the call sends it whole with EVAL once, which caches it again: one more
// round trip, once per script and server, and never a call that fails for
// it.
type hotScript struct {
	sha  any // the SHA-1 of body, in hex, boxed
	body any // the text, boxed
}

func newHotScript(src string) hotScript {
	body := minify(src)
	sum := sha1.Sum([]byte(body))
	return hotScript{sha: hex.EncodeToString(sum[:]), body: body}
}

// bytesString returns b as a string that aliases it: for a result that the
// caller does not change while the call runs.
func bytesString(b []byte) string {
	if len(b) == 0 {
		return ""
	}
	return unsafe.String(unsafe.SliceData(b), len(b))
}
