// Package redistest gives tests a real Redis: a standalone server, a
// three-master Redis Cluster, and a server of their own that they may stop
// and restart.
//
// Server and Cluster start redis-server processes on free ports the first
// time a test binary asks for them, and share them with every later test of
// that binary; each call returns a new client, closed when the test ends.
// Tests keep out of each other's way with a key prefix of their own (Prefix),
// and nothing in this package ever flushes a server. Wrap the test binary's
// main so that the servers stop when the tests end:
//
//	func TestMain(m *testing.M) {
//		goleak.VerifyTestMain(redistest.Main(m))
//	}
//
// (Without Main the processes still die with the test binary on Linux, but
// their temporary directories stay.)
//
// The environment changes where the servers come from:
//
//   - IDEMPOTENCY_TEST_REDIS_URL (redis://host:port/db) points Server at an
//     existing server instead of starting one. Tests only touch keys under
//     their own prefix there.
//   - IDEMPOTENCY_TEST_REDIS_CLUSTER_ADDRS (host:port,host:port,...) points
//     Cluster at an existing cluster.
//   - IDEMPOTENCY_TEST_REDIS_SERVER (a path, or a name on PATH) is the
//     server binary every helper starts instead of redis-server: Valkey's
//     valkey-server, say (its sentinel mode too, with --sentinel).
//     IDEMPOTENCY_TEST_REDIS_CLI is the CLI that joins a cluster; without
//     it, the one beside the server ("server" replaced by "cli" in the
//     name: valkey-cli). A binary they name that is missing, or whose
//     --version is not a Redis or Valkey server's, fails the test. The
//     first test of a binary that starts a server logs which it is
//     (ServerBinary).
//   - Without a redis-server binary on PATH, Server and Start fall back to
//     miniredis, an embedded Redis for Go (whose keys expire in real time
//     here, like Redis's), and log that they did; Cluster skips the test.
//   - IDEMPOTENCY_TEST_REQUIRE_REDIS=1 makes a missing redis-server (or
//     redis-cli, for Cluster) a test failure instead: CI sets it, so that
//     nothing is skipped there.
package redistest
