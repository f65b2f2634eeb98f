// Package redisrepo is a [idemstore.Store] on Redis, through go-redis v9:
// a standalone server, Sentinel, or Redis Cluster.
//
//	client := redis.NewUniversalClient(&redis.UniversalOptions{Addrs: addrs})
//	store := redisrepo.New(client) // keys "idempotency:{operation}:{key}"
//	c, err := coordinator.New(store)
//
// # Layout
//
// Each (operation, key) is one Redis key, prefix + operation + ":" + key,
// holding one STRING, format version 2: a 6-byte header (version, state,
// flags, token and fingerprint lengths), the owner token, the request
// fingerprint and, for a completed record, the encoded result
// (docs/architecture.md describes it byte by byte). Its Redis time to live
// is the lease of a pending record and the time to live of a completed one;
// only Redis's clock decides expiry.
//
// Records of format 1, the HASH that earlier releases wrote, are still
// read, so that they replay after an upgrade; WithRecordFormat(Format1)
// writes them too, for the length of a rolling upgrade. A
// value that no reader of this package can read (another Redis type, a
// STRING of another format, a record cut short) is reported as
// idemstore.StateUnreadable with token "", never as an error: the
// coordinator runs the action and replaces it (Write.Replace with
// ReplaceToken ""), so the key heals. An earlier release treats a format 2
// record the same way: while one still serves the same keys, write format 1
// (see docs/architecture.md, "Rolling out a format").
//
// # Round trips
//
// Every Store method is one round trip on one key. The common paths are plain
// commands or small scripts sent whole: Reserve is SET NX PX GET, Get is GET,
// and Complete, Renew and Release are Lua scripts sent with EVAL. None of
// them depends on the server's script cache, so a restart, a failover or
// SCRIPT FLUSH costs them nothing. The rare paths (a heal, a format 1 record,
// Inspect, Forget) run their scripts with EVALSHA and fall back to EVAL when
// the server does not have them cached (one more round trip, once per script
// and server; LoadScripts avoids it). Script arguments are data (KEYS and
// ARGV), never script text, so a key of any visible ASCII characters cannot
// change what a script does. redis.Nil never leaves the package.
//
// # Waiting across processes
//
// The Store implements idemstore.Watcher: a caller that waits on a key
// held in another process is woken through Redis Pub/Sub when the holder
// completes or releases it, with one subscription per Store while anyone
// waits; see Store.Watch.
//
// # Redis Cluster
//
// Each command and script touches one key, so the Store works on a cluster
// unchanged:
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
