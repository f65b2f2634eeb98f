// Package reliability holds the reliability suite: storms of concurrent
// duplicate calls through coordinator.Do on a real Redis (a standalone
// server, a Redis Cluster with replicas, and a master and replica behind
// Redis Sentinel), in every pair of in-flight and
// on-storage-error modes, with faults injected while they run: kill -9 and
// an empty restart, SIGSTOP, DEBUG SLEEP, CLIENT KILL loops, SCRIPT FLUSH
// loops, a link held by a fault proxy and released newest first, and a
// cluster master killed, and SENTINEL FAILOVER; and fleets of worker
// processes (reliability/fleetworker) whose settings or release a deploy
// changes one process at a time, by SIGTERM and kill -9; and a payment
// provider in a process of its own that services (reliability/chargeworker)
// charge through coordinator.Do while they are killed -9 around the call.
// Every call is recorded, and every history is checked
// with a linearizability checker (github.com/anishathalye/porcupine) against
// the guarantee that docs/architecture.md documents, key by key; every
// action run beyond the first is classified as allowed by the docs (and
// why) or not.
//
// The package has tests only. They are skipped unless
// IDEMPOTENCY_TEST_RELIABILITY is set: "short" runs the subset that CI runs
// (every fault kind, `make test-reliability-short`), "full" runs every
// scenario with longer storms (`make test-reliability`). The checker's own
// tests, on synthetic histories, always run. docs/reliability.md describes
// the scenarios and the figures measured with this suite.
package reliability
