//go:build !linux

package redistest

import (
	"os"
	"syscall"
)

// sysProcAttr returns nil: only Linux can tie a child's life to its parent's.
func sysProcAttr() *syscall.SysProcAttr { return nil }

// killGroup kills p alone.
func killGroup(p *os.Process) error { return p.Kill() }
