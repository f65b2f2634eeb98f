package redistest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// startTimeout bounds how long a redis-server may take to answer PING.
const startTimeout = 10 * time.Second

// proc is a redis-server process.
type proc struct {
	port int
	dir  string
	cmd  *exec.Cmd
	done chan struct{} // closed when the process has exited
}

func (p *proc) addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(p.port)) }

// startServer starts redis-server in dir, on port, or on a free port when
// port is 0 (trying again with another port when the one it picked was taken
// in the meantime). extra are more arguments. It returns once the server
// answers PING.
func startServer(dir string, port int, extra ...string) (*proc, error) {
	pick := port == 0
	cluster := len(extra) > 0
	var err error
	for range 5 {
		if pick {
			if port, err = freePort(cluster); err != nil {
				return nil, err
			}
		}
		var p *proc
		p, err = spawn(dir, port, extra)
		if err == nil {
			return p, nil
		}
		if !pick {
			break
		}
	}
	return nil, err
}

// spawn starts one server (redis-server, or EnvServer's) and waits for it to
// answer PING.
func spawn(dir string, port int, extra []string) (*proc, error) {
	bin, err := serverPath()
	if err != nil {
		return nil, err
	}
	return spawnBinary(bin, dir, port, extra)
}

// spawnBinary starts the server binary bin in dir on port, with the
// arguments of every server of this package and then extra, and waits for
// it to answer PING.
func spawnBinary(bin, dir string, port int, extra []string) (*proc, error) {
	logPath := filepath.Join(dir, "redis-"+strconv.Itoa(port)+".log")
	args := append([]string{
		"--port", strconv.Itoa(port),
		"--bind", "127.0.0.1",
		"--save", "",
		"--appendonly", "no",
		"--dir", dir,
		"--logfile", logPath,
		// Fault tests stall the server with DEBUG SLEEP (Redis 7 refuses
		// DEBUG unless it is enabled).
		"--enable-debug-command", "local",
	}, extra...)
	return startProc(exec.Command(bin, args...), dir, port, logPath, filepath.Base(bin))
}

// startProc starts cmd, a redis-server that will listen on port, in dir, and
// waits for it to answer PING; what names it in errors, logPath is its log.
func startProc(cmd *exec.Cmd, dir string, port int, logPath, what string) (*proc, error) {
	cmd.Dir = dir
	cmd.SysProcAttr = sysProcAttr()
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", what, err)
	}
	p := &proc{port: port, dir: dir, cmd: cmd, done: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		close(p.done)
	}()

	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	opts := &redis.Options{Addr: p.addr(), MaxRetries: -1, DialerRetries: 1, DialTimeout: 200 * time.Millisecond}
	for {
		// Wait for the port before the first PING: go-redis logs every
		// failed dial.
		err := listening(p.addr())
		if err == nil {
			// Our process must be the one answering: a redis-server that
			// lost the race for its port exits, and another server may
			// be listening there.
			if err = pingPID(ctx, opts, cmd.Process.Pid); err == nil {
				return p, nil
			}
		}
		select {
		case <-p.done:
			return nil, fmt.Errorf("%s on port %d exited: %s", what, port, tail(logPath))
		case <-ctx.Done():
			p.kill()
			return nil, fmt.Errorf("%s on port %d did not answer PING within %v: %v; log: %s",
				what, port, startTimeout, err, tail(logPath))
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// listening reports whether something accepts connections at addr.
func listening(addr string) error {
	c, err := net.DialTimeout("tcp", addr, 100*time.Millisecond)
	if err != nil {
		return err
	}
	return c.Close()
}

// kill stops the process and waits for it to exit.
func (p *proc) kill() {
	_ = killGroup(p.cmd.Process)
	<-p.done
}

// ping sends one PING with a client of its own, which tries once: no retry,
// one dial.
// pingPID pings the server at opts and checks that it is process pid.
func pingPID(ctx context.Context, opts *redis.Options, pid int) error {
	o := *opts
	o.MaxRetries, o.DialerRetries = -1, 1
	c := redis.NewClient(&o)
	defer c.Close()
	info, err := c.Info(ctx, "server").Result()
	if err != nil {
		return err
	}
	want := fmt.Sprintf("process_id:%d\r\n", pid)
	if !strings.Contains(info, want) {
		return fmt.Errorf("the server on %s is not the redis-server we started (pid %d)", o.Addr, pid)
	}
	return nil
}

// freePort returns a TCP port on 127.0.0.1 that nothing listens on. With
// bus, port+10000 (the cluster bus port of a cluster node) is free too.
func freePort(bus bool) (int, error) {
	for range 100 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return 0, fmt.Errorf("find a free port: %w", err)
		}
		port := l.Addr().(*net.TCPAddr).Port
		if !bus {
			_ = l.Close()
			return port, nil
		}
		if port+10000 > 65535 {
			_ = l.Close()
			continue
		}
		l2, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port+10000)))
		_ = l.Close()
		if err != nil {
			continue
		}
		_ = l2.Close()
		return port, nil
	}
	return 0, errors.New("find a free port: none found")
}

// tail returns the end of the file at path, for error messages.
func tail(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return "(no log: " + err.Error() + ")"
	}
	if len(b) > 2000 {
		b = b[len(b)-2000:]
	}
	return string(b)
}

// ping checks that a server answers at opts.
func ping(ctx context.Context, opts *redis.Options) error {
	o := *opts
	o.MaxRetries, o.DialerRetries = -1, 1
	c := redis.NewClient(&o)
	defer c.Close()
	return c.Ping(ctx).Err()
}

// Process is a redis-server process that a test manages itself, for setups
// that Server, Cluster and Start do not give: the reliability suite's
// cluster with replicas, whose masters it kills.
type Process struct{ p *proc }

// StartProcess starts redis-server in dir, on a free port of 127.0.0.1, with
// the arguments of every server of this package (no persistence, DEBUG for
// local connections) and then extra. With extra arguments (cluster mode) the
// port's cluster bus port, +10000, is free too. It returns once the server
// answers PING. On Linux the kernel kills it when the test binary dies; Kill
// it when done.
func StartProcess(dir string, extra ...string) (*Process, error) {
	p, err := startServer(dir, 0, extra...)
	if err != nil {
		return nil, err
	}
	return &Process{p: p}, nil
}

// Addr returns the server's address, 127.0.0.1:port.
func (p *Process) Addr() string { return p.p.addr() }

// Exited is closed when the process has exited.
func (p *Process) Exited() <-chan struct{} { return p.p.done }

// Kill kills the process with SIGKILL and waits for it to exit.
func (p *Process) Kill() { p.p.kill() }
