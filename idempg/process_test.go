package idempg_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idempotency/coordinator"
	"github.com/idemkit/idempotency/idempg"
)

// The environment of a child process of TestTwoProcesses: when childEnv is
// set, TestMain runs child instead of the tests.
const (
	childEnv    = "IDEMPG_TEST_CHILD_DSN"
	childSchema = "IDEMPG_TEST_CHILD_SCHEMA"
	childKey    = "IDEMPG_TEST_CHILD_KEY"
)

// childOut is what a child prints: its call's outcome.
type childOut struct {
	PID      int    `json:"pid"`
	Value    string `json:"value"`
	Replayed bool   `json:"replayed"`
	Err      string `json:"err"`
}

// child connects, prints "ready", waits for a line on stdin, then calls Do
// once on the key with an action that writes a ledger row and holds its
// transaction for half a second, and prints the outcome as JSON.
func child() int {
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(os.Getenv(childEnv))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	cfg.ConnConfig.RuntimeParams["search_path"] = os.Getenv(childSchema)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	defer pool.Close()
	if err := pool.Ping(ctx); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	store, err := idempg.New(pool)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	s, err := coordinator.New(store)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	key := os.Getenv(childKey)
	fmt.Println("ready")
	if _, err := bufio.NewReader(os.Stdin).ReadString('\n'); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	res, err := idempg.DoResult(ctx, s, call(key), func(ctx context.Context, tx pgx.Tx) (string, error) {
		v := fmt.Sprintf("ran in process %d", os.Getpid())
		if err := insertLedger(ctx, tx, key, v); err != nil {
			return "", err
		}
		time.Sleep(500 * time.Millisecond)
		return v, nil
	})
	out := childOut{PID: os.Getpid(), Value: res.Value, Replayed: res.Replayed}
	if err != nil {
		out.Err = err.Error()
	}
	b, _ := json.Marshal(out)
	fmt.Println(string(b))
	return 0
}

// Two OS processes call one key at once: one runs, the other replays the
// result that committed.
func TestTwoProcesses(t *testing.T) {
	db := newDB(t, 4)
	key := uniqueKey("processes")
	type proc struct {
		cmd   *exec.Cmd
		stdin io.WriteCloser
		out   *bufio.Reader
	}
	procs := make([]proc, 2)
	for i := range procs {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), childEnv+"="+server.DSN, childSchema+"="+db.schema, childKey+"="+key)
		cmd.Stderr = os.Stderr
		stdin, err := cmd.StdinPipe()
		if err != nil {
			t.Fatal(err)
		}
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
		procs[i] = proc{cmd, stdin, bufio.NewReader(stdout)}
	}
	for i, p := range procs {
		line, err := p.out.ReadString('\n')
		if err != nil || strings.TrimSpace(line) != "ready" {
			t.Fatalf("child %d: %q, %v; want ready", i, line, err)
		}
	}
	for _, p := range procs { // go, both at once
		_, _ = io.WriteString(p.stdin, "go\n")
	}
	outs := make([]childOut, len(procs))
	for i, p := range procs {
		line, err := p.out.ReadString('\n')
		if err != nil {
			t.Fatalf("child %d: %v", i, err)
		}
		if err := json.Unmarshal([]byte(line), &outs[i]); err != nil {
			t.Fatalf("child %d printed %q: %v", i, line, err)
		}
		if err := p.cmd.Wait(); err != nil {
			t.Fatalf("child %d: %v", i, err)
		}
	}
	t.Logf("children: %+v", outs)
	for i, o := range outs {
		if o.Err != "" {
			t.Fatalf("child %d: %s", i, o.Err)
		}
	}
	if outs[0].Replayed == outs[1].Replayed {
		t.Fatalf("replayed: %v and %v; want one run and one replay", outs[0].Replayed, outs[1].Replayed)
	}
	want := fmt.Sprintf("ran in process %d", outs[0].PID)
	if outs[0].Replayed {
		want = fmt.Sprintf("ran in process %d", outs[1].PID)
	}
	if outs[0].Value != want || outs[1].Value != want {
		t.Fatalf("values %q and %q, want both %q", outs[0].Value, outs[1].Value, want)
	}
	if n := db.ledger(t, key); n != 1 {
		t.Fatalf("ledger rows: %d, want 1", n)
	}
}
