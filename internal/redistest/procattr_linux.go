package redistest

import (
	"os"
	"syscall"
)

// sysProcAttr makes the kernel kill a redis-server when the test binary that
// started it dies, so that no server outlives a crashed or killed test, and
// puts it in a process group of its own, so that killGroup reaches the
// children it forks (an RDB or AOF rewrite still writing into its folder).
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
}

// killGroup kills p's process group: p and the children it forked.
func killGroup(p *os.Process) error {
	return syscall.Kill(-p.Pid, syscall.SIGKILL)
}
