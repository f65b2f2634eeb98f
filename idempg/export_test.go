package idempg

// SweepSQL is the sweep's statement, for a test that checks its plan.
const SweepSQL = sweepRecords

// KeptTxs returns how many connections' Tx s keeps (connTxs).
func (s *Store) KeptTxs() int {
	n := 0
	s.txs.m.Range(func(any, any) bool { n++; return true })
	return n
}
