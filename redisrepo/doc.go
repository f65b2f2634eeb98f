// Package redisrepo is a [coordinator.Store] on Redis, through go-redis v9:
// a standalone server, Sentinel, or Redis Cluster.
//
//	client := redis.NewUniversalClient(&redis.UniversalOptions{Addrs: addrs})
//	store := redisrepo.New(client) // keys "idempotency:{operation}:{key}"
//	c, err := coordinator.New(store)
//
// # Layout
//
// Each (operation, key) is one Redis key, prefix + operation + ":" + key,
// holding a small HASH, format version 1:
//
//	v           "1", the format version
//	state       "pending" (a caller holds the lease) or "completed"
//	token       the owner token of the caller that reserved it
//	fp          the request fingerprint, "" for none
//	result      the encoded result (completed records only)
//	created_ms  when it was written, Unix milliseconds by the Redis server's clock
//
// Its Redis time to live is the lease of a pending record and the time to
// live of a completed one; only Redis's clock decides expiry (PEXPIRE). A
// reader ignores fields it does not know, so adding a field needs no new
// version. A value it cannot read — another Redis type, a missing field, an
// unknown state, or a format version other than 1 — is reported as
// coordinator.StateUnreadable with token "", never as an error: the
// coordinator runs the action and replaces it (Write.Replace with
// ReplaceToken ""), so the key heals. A later, incompatible format must
// therefore be rolled out readers first, or under a new key prefix.
//
// # Round trips
//
// Every Store method is one Lua script on that one key, run with EVALSHA
// (one round trip) and falling back to EVAL when the server does not have it
// cached (one more, once per script and server; LoadScripts avoids it).
// Script arguments are data (KEYS and ARGV), never script text, so a key of
// any visible ASCII characters cannot change what a script does. No script
// replies nil, and redis.Nil never leaves the package.
//
// # Redis Cluster
//
// Each script touches one key, so the Store works on a cluster unchanged:
// records spread over the slots by CRC16 of their Redis key. A key that holds
// a hash tag, a non-empty "{...}", hashes only what is inside the first one,
// as Redis Cluster defines: "{tenant-7}-order-1" and "{tenant-7}-order-2"
// share a slot. That is harmless for correctness (no script spans two keys)
// and lets callers keep related keys together, but a caller that puts one
// tag in every key puts every record on one node. A prefix with a hash tag,
// such as "{idempotency}:", does that for all keys on purpose.
//
// # Operator tools
//
// Inspect reports the state (absent, pending, completed, unreadable),
// remaining time to live, creation time, fingerprint and result size of any
// number of keys; Forget deletes keys whoever holds them, so that a client
// may retry after a manual fix. On a cluster both group the keys by hash
// slot, one script call per slot, sent in one pipeline: one round trip per
// node, and never a CROSSSLOT error.
//
// Errors: a failed call to Redis by one of the five Store methods (the
// network, a timeout, a cancelled context, a server error) is a
// *coordinator.StorageError naming the method, which unwraps to the go-redis
// error. The operator calls (Inspect, Forget, LoadScripts) return the go-redis
// error wrapped with the call's name.
package redisrepo
