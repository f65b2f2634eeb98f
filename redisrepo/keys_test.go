package redisrepo_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idempotency/coordinator/idemstore"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idempotency/internal/redistest"
	"github.com/idemkit/idempotency/redisrepo"
)

// visibleASCII is every byte a key may hold: 0x21 to 0x7E.
func visibleASCII() string {
	var b strings.Builder
	for c := byte(0x21); c <= 0x7e; c++ {
		b.WriteByte(c)
	}
	return b.String()
}

// hostileKeys are keys made of every visible ASCII character, alone and
// together, and keys that would change a script if the store built script
// text from them: they must be data, one Redis key each, and nothing else.
func hostileKeys() []string {
	keys := []string{
		visibleASCII(),
		strings.Repeat("}", 255),
		`{`, `}`, `{}`, `{a}`, `}{`, `{a}{b}`, `a{b}c`, `::`, `:`, `"`, `\`, `'`, `\"`, `\'`, `\\`,
		`"..redis.call('FLUSHALL').."`,
		`')redis.call('DEL',KEYS[1])--`,
		`]]redis.call('SET','pwned','1')--[[`,
		`%s%d%q%%`, `$1`, `*1`, `\r\n`, `--`, `[[`, `]]`, `#`, `0`, `-1`,
	}
	for c := byte(0x21); c <= 0x7e; c++ {
		keys = append(keys, string([]byte{c}))
	}
	return keys
}

func TestKeysAnyVisibleASCII(t *testing.T) {
	eachBackend(t, func(t *testing.T, c redis.UniversalClient) {
		ctx := context.Background()
		prefix := redistest.Prefix(t)
		s := redisrepo.New(c, redisrepo.WithKeyPrefix(prefix))
		sentinel := s.Key(idemstore.Key{Operation: "sentinel", Key: "x"})
		if err := c.Set(ctx, sentinel, "untouched", time.Minute).Err(); err != nil {
			t.Fatal(err)
		}
		ops := []string{"op", "A.b-c_9", strings.Repeat("o", 100)}
		for i, k := range hostileKeys() {
			key := idemstore.Key{Operation: ops[i%len(ops)], Key: k}
			name := s.Key(key)
			if want := prefix + key.Operation + ":" + k; name != want {
				t.Fatalf("Key(%q) = %q, want %q", k, name, want)
			}
			tok := token()
			mustReserve(t, s, key, pendingWrite(tok, k, time.Minute))
			if v, err := c.Get(ctx, name).Result(); err != nil || !strings.HasSuffix(v, k) {
				t.Fatalf("key %q: GET %q = %q, %v; want our record", k, name, v, err)
			}
			if ok, err := s.Renew(ctx, key, tok, time.Minute); !ok || err != nil {
				t.Fatalf("key %q: Renew = %v, %v", k, ok, err)
			}
			if ok, err := s.Complete(ctx, key, tok, idemstore.Completion{State: idemstore.StateCompleted, Result: []byte(k), TTL: time.Minute}); !ok || err != nil {
				t.Fatalf("key %q: Complete = %v, %v", k, ok, err)
			}
			rec := mustGet(t, s, key)
			if rec.State != idemstore.StateCompleted || rec.Token != tok || rec.Fingerprint != k || string(rec.Result) != k {
				t.Fatalf("key %q: Get = %+v", k, rec)
			}
			infos, err := s.Inspect(ctx, key)
			if err != nil || len(infos) != 1 || infos[0].State != idemstore.StateCompleted || infos[0].RedisKey != name {
				t.Fatalf("key %q: Inspect = %+v, %v", k, infos, err)
			}
			if n, err := s.Forget(ctx, key); n != 1 || err != nil {
				t.Fatalf("key %q: Forget = %d, %v", k, n, err)
			}
			if n := c.Exists(ctx, name).Val(); n != 0 {
				t.Fatalf("key %q: still there after Forget", k)
			}
		}
		if v, err := c.Get(ctx, sentinel).Result(); v != "untouched" || err != nil {
			t.Errorf("the sentinel key: %q, %v; a key changed what a script did", v, err)
		}
		if n := c.Exists(ctx, "pwned").Val(); n != 0 {
			t.Errorf("a key changed what a script did: key pwned exists")
		}
	})
}
