//go:build !(linux || darwin || freebsd)

package main

import "os"

// isTerminalFile reports whether f is a character device: where the
// terminal attributes cannot be read, the closest test (which takes a null
// device for a terminal: a prompt then reads nothing, and nothing is
// confirmed).
func isTerminalFile(f *os.File) bool {
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}
