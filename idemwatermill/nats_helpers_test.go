package idemwatermill_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemkit/idempotency/internal/redistest"
)

// natsStartTimeout bounds how long nats-server may take to accept a
// connection: generous, for a busy machine.
const natsStartTimeout = 30 * time.Second

// natsServer is the nats-server (with JetStream) that the tests of this
// binary share, started on first use.
var natsServer struct {
	once sync.Once
	url  string
	cmd  *exec.Cmd
	dir  string
	done chan struct{}
	err  error
}

// natsURL returns the URL of the shared nats-server, starting it first.
// Without a nats-server binary on PATH it skips the test, or fails it when
// IDEMPOTENCY_TEST_REQUIRE_REDIS is set (as CI does: no skips there).
func natsURL(t testing.TB) string {
	t.Helper()
	if _, err := exec.LookPath("nats-server"); err != nil {
		if v := os.Getenv(redistest.EnvRequire); v == "1" || v == "true" {
			t.Fatalf("%s=%s but nats-server is not on PATH (Debian package nats-server)", redistest.EnvRequire, v)
		}
		t.Skipf("no nats-server on PATH: skipping a test that needs NATS JetStream "+
			"(install the Debian package nats-server; set %s=1 to make this a failure)", redistest.EnvRequire)
	}
	natsServer.once.Do(func() { natsServer.err = startNATS() })
	if natsServer.err != nil {
		t.Fatalf("start nats-server: %v", natsServer.err)
	}
	return natsServer.url
}

// startNATS starts nats-server with JetStream on a free port, its store in
// a temporary directory, and waits until it accepts a client.
func startNATS() error {
	dir, err := os.MkdirTemp("", "idemwatermill-nats-")
	if err != nil {
		return err
	}
	natsServer.dir = dir
	var last error
	for attempt := range 5 {
		port, err := freePort()
		if err != nil {
			return err
		}
		logPath := filepath.Join(dir, fmt.Sprintf("nats-%d.log", attempt))
		cmd := exec.Command("nats-server", "-js", "-a", "127.0.0.1", "-p", strconv.Itoa(port),
			"-sd", filepath.Join(dir, "js"), "-l", logPath)
		if err := cmd.Start(); err != nil {
			return fmt.Errorf("start nats-server: %w", err)
		}
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		url := "nats://127.0.0.1:" + strconv.Itoa(port)
		if last = waitNATS(url, done); last == nil {
			natsServer.url, natsServer.cmd, natsServer.done = url, cmd, done
			return nil
		}
		_ = cmd.Process.Kill()
		<-done
		log, _ := os.ReadFile(logPath)
		last = fmt.Errorf("%w; log: %s", last, log)
	}
	return last
}

// waitNATS waits until a client connects to url and JetStream answers, or
// the server exits.
func waitNATS(url string, exited <-chan struct{}) error {
	deadline := time.Now().Add(natsStartTimeout)
	for {
		nc, err := nats.Connect(url, nats.Timeout(time.Second), nats.NoReconnect())
		if err == nil {
			err = jetStreamReady(nc)
			nc.Close()
			if err == nil {
				return nil
			}
		}
		select {
		case <-exited:
			return errors.New("nats-server exited")
		default:
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("nats-server at %s did not answer within %v: %w", url, natsStartTimeout, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// jetStreamReady checks that JetStream answers on nc.
func jetStreamReady(nc *nats.Conn) error {
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err = js.AccountInfo(ctx)
	return err
}

// freePort returns a TCP port on 127.0.0.1 that nothing listens on.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("find a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// stopNATS wraps the tests' main so that the shared nats-server stops, and
// its directory goes, when the tests end.
type stopNATS struct{ m redistest.TestingM }

func (s stopNATS) Run() int {
	code := s.m.Run()
	if natsServer.cmd != nil {
		_ = natsServer.cmd.Process.Kill()
		<-natsServer.done
	}
	if natsServer.dir != "" {
		_ = os.RemoveAll(natsServer.dir)
	}
	return code
}
