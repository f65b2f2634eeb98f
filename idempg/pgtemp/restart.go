package pgtemp

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Kill kills the server's postmaster with SIGKILL, as a crash would, and
// waits until the server is gone. Nothing is shut down cleanly: no
// checkpoint is written, and the backends and auxiliary processes the
// postmaster leaves exit on their own when they notice that it is gone
// (every process of the server checks that whenever it waits: for a
// client, a lock, a latch); Kill waits for them too, for up to a minute.
// Restart starts the server again on the same data directory and port,
// which then goes through crash recovery.
//
// Kill is meant for the test that owns the server: it must not be called
// concurrently with Restart or Stop.
func (s *Server) Kill() error {
	if s == nil || s.cmd == nil || s.cmd.Process == nil {
		return errors.New("pgtemp: kill: the server is not running")
	}
	select {
	case <-s.done:
		return errors.New("pgtemp: kill: the server has already exited")
	default:
	}
	pid := s.cmd.Process.Pid
	children := childrenOf(pid)
	if err := s.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		return fmt.Errorf("pgtemp: kill postmaster %d: %w", pid, err)
	}
	<-s.done
	deadline := time.Now().Add(time.Minute)
	for _, pid := range children {
		for alive(pid) {
			if time.Now().After(deadline) {
				return fmt.Errorf("pgtemp: kill: process %d of the killed server still runs after a minute", pid)
			}
			time.Sleep(10 * time.Millisecond) // polling a process we cannot wait for
		}
	}
	return nil
}

// Restart starts postgres again, with the command line it ran with, on the
// same data directory, port and socket, after Kill: it starts the
// postmaster and waits until it accepts connections, that is until crash
// recovery is done. A postmaster that exits at start-up (a leftover of the
// killed server, such as its shared memory still attached) is started
// again; Restart fails after a minute.
func (s *Server) Restart() error {
	if s == nil || s.cmd == nil {
		return errors.New("pgtemp: restart: the server was never started")
	}
	select {
	case <-s.done:
	default:
		return errors.New("pgtemp: restart: the server is running; Kill it first")
	}
	deadline := time.Now().Add(time.Minute)
	old := s.cmd
	for attempt := 1; ; attempt++ {
		cmd := exec.Command(old.Path, old.Args[1:]...)
		cmd.SysProcAttr = old.SysProcAttr
		logf, err := os.OpenFile(s.log, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
		if err != nil {
			return fmt.Errorf("pgtemp: restart: %w", err)
		}
		cmd.Stdout, cmd.Stderr = logf, logf
		err = cmd.Start()
		_ = logf.Close()
		if err != nil {
			return fmt.Errorf("pgtemp: restart postgres: %w", err)
		}
		done := make(chan struct{})
		go func() {
			_ = cmd.Wait()
			close(done)
		}()
		s.cmd, s.done = cmd, done
		err = s.ready()
		if err == nil {
			return nil
		}
		select {
		case <-done: // it exited at start-up: a leftover of the killed server, try again
		default:
			return fmt.Errorf("pgtemp: restart (attempt %d): %w", attempt, err)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("pgtemp: restart: postgres did not start within a minute (%d attempts): %w", attempt, err)
		}
		time.Sleep(50 * time.Millisecond) // before the next attempt
	}
}

// childrenOf returns the processes whose parent is pid.
func childrenOf(pid int) []int {
	entries, _ := os.ReadDir("/proc")
	var out []int
	for _, e := range entries {
		child, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if ppid, _, ok := procStat(child); ok && ppid == pid {
			out = append(out, child)
		}
	}
	return out
}

// alive reports whether process pid exists and is not a zombie (a zombie
// has released its memory; an orphan's zombie may stay until init reaps it).
func alive(pid int) bool {
	_, state, ok := procStat(pid)
	return ok && state != "Z" && state != "X"
}

// procStat returns the parent and the state of process pid from
// /proc/<pid>/stat.
func procStat(pid int) (ppid int, state string, ok bool) {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return 0, "", false
	}
	// pid (comm) state ppid ...; comm may hold spaces and parentheses.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, "", false
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 2 {
		return 0, "", false
	}
	ppid, err = strconv.Atoi(f[1])
	return ppid, f[0], err == nil
}
