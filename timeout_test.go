package idempotency_test

import (
	"context"
	"net"
	"os/exec"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/coordinator"
	"github.com/idemkit/idempotency/internal/redistest"
)

// The storage timeout bounds a call on a hung Redis through the client the
// module builds: go-redis ignores context deadlines on sockets unless
// ContextTimeoutEnabled is set (NewRedisClient sets it), and would otherwise
// hold every call for its own ReadTimeout (5s). The test freezes a
// redis-server of its own with SIGSTOP. (Skipped without redis-server.)
func TestHungRedisIsBoundedByTheStorageTimeout(t *testing.T) {
	bin := redistest.ServerBinary(t).Path // a hung server needs a real one (miniredis cannot be frozen)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	srv := exec.Command(bin, "--port", strconv.Itoa(port), "--save", "", "--appendonly", "no", "--dir", t.TempDir())
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		_ = srv.Process.Signal(syscall.SIGCONT)
		_ = srv.Process.Kill()
		_ = srv.Wait()
	}()

	s := idempotency.DefaultSettings()
	s.RedisURL = "redis://127.0.0.1:" + strconv.Itoa(port) + "/0"
	s.StorageTimeout = 100 * time.Millisecond
	s.OnStorageError = coordinator.OnStorageErrorRaise
	client, err := idempotency.NewRedisClient(s)
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	for deadline := time.Now().Add(5 * time.Second); client.Ping(t.Context()).Err() != nil; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("redis-server does not answer")
		}
	}
	c, err := idempotency.NewCoordinator(s, idempotency.NewStore(s, client), nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := coordinator.Do(t.Context(), c, coordinator.Call{Operation: "op", Key: "warm"}, func(context.Context) (int, error) { return 1, nil }); err != nil {
		t.Fatal(err)
	}

	_ = srv.Process.Signal(syscall.SIGSTOP) // Redis hangs (a long script, a stall, a blackholed link)
	start := time.Now()
	_, err = coordinator.Do(t.Context(), c, coordinator.Call{Operation: "op", Key: "hung-redis"}, func(context.Context) (int, error) { return 1, nil })
	if d := time.Since(start); d > time.Second {
		t.Fatalf("Do took %v on a hung Redis with IDEMPOTENCY_STORAGE_TIMEOUT=100ms (err %v)", d, err)
	}
}
