package idempg

// SweepSQL is the sweep's statement, for a test that checks its plan.
const SweepSQL = sweepRecords
