//go:build !race

package reliability_test

// raceDetector reports whether the race detector is on (see race_on_test.go).
const raceDetector = false
