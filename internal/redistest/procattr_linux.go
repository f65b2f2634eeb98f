package redistest

import "syscall"

// sysProcAttr makes the kernel kill a redis-server when the test binary that
// started it dies, so that no server outlives a crashed or killed test.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
