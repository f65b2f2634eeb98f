//go:build race

package reliability_test

// raceDetector reports whether the race detector is on: it makes this
// process several times slower, and a storm whose load is set for a plain
// build then starves its own process instead of testing the library.
const raceDetector = true
