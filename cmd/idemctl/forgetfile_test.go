package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idempotency/coordinator/idemstore"

	"github.com/idemkit/idempotency/redisrepo"
)

func TestForgetFile(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		recs := newRecords(t, b, redisrepo.Format2)
		const op, n = "order.create", 2500
		var lines []string
		for i := range n {
			k := fmt.Sprintf("order-%d", i)
			if i%2 == 0 {
				recs.completed(op, k, "", []byte("r"))
			}
			lines = append(lines, k)
		}
		// Blank lines, spaces around a key and CRLF line ends are not keys.
		body := strings.Join(lines[:10], "\r\n") + "\n\n  " + strings.Join(lines[10:], "\n") + "\n"
		file := filepath.Join(t.TempDir(), "keys.txt")
		if err := os.WriteFile(file, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}

		setEnv(t, b.env)
		var stdout, stderr bytes.Buffer
		a := &app{stdin: strings.NewReader(""), stdout: &stdout, stderr: &stderr, progressEvery: time.Nanosecond}
		if code := a.run(t.Context(), []string{"forget", "-file", file, op}); code != exitOK {
			t.Fatalf("forget -file: exit %d\n%s%s", code, stdout.String(), stderr.String())
		}
		if want := fmt.Sprintf("forgot %d of %d keys of order.create (%d absent)", n/2, n, n/2); !strings.Contains(stdout.String(), want) {
			t.Errorf("forget -file said %q, want %q", stdout.String(), want)
		}
		// A line per batch of 1000 (the interval is tiny here): 1000, 2000, 2500.
		for _, want := range []string{"1000 of 2500 (40%) keys of order.create so far", "2000 of 2500 (80%)", "2500 of 2500 (100%)"} {
			if !strings.Contains(stderr.String(), want) {
				t.Errorf("progress lacks %q:\n%s", want, stderr.String())
			}
		}
		for _, i := range []int{0, 10, 2498} {
			if st := recs.state(op, lines[i]); st != idemstore.StateAbsent {
				t.Errorf("%s is %v after forget -file", lines[i], st)
			}
		}

		// From stdin, with keys on the command line too; nothing left.
		recs.completed(op, "extra", "", []byte("r"))
		r := idemctl(t, b.env, "order-0\norder-2\n", false, "forget", "-file", "-", op, "extra")
		if r.code != exitOK || !strings.Contains(r.stdout, "forgot 1 of 3 keys of order.create (2 absent)") {
			t.Errorf("forget -file - with a key argument: exit %d\n%s", r.code, r.output())
		}

		// A bad key fails before anything is forgotten, naming its line.
		recs.completed(op, "kept", "", []byte("r"))
		r = idemctl(t, b.env, "kept\nhas space\n", false, "forget", "-file", "-", op)
		if r.code != exitUsage || !strings.Contains(r.stderr, "-, line 2") {
			t.Errorf("forget -file with a bad key: exit %d\n%s", r.code, r.output())
		}
		if st := recs.state(op, "kept"); st != idemstore.StateCompleted {
			t.Errorf("a refused forget -file forgot a key: %v", st)
		}
		for _, args := range [][]string{
			{"forget", "-file", filepath.Join(t.TempDir(), "missing.txt"), op},
			{"forget", "-operation", op, "-all", "-file", file},
		} {
			if r := idemctl(t, b.env, "", false, args...); r.code != exitUsage {
				t.Errorf("%q: exit %d, want %d\n%s", args, r.code, exitUsage, r.output())
			}
		}
	})
}

func TestForgetAllProgress(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		recs := newRecords(t, b, redisrepo.Format2)
		const op = "order.create"
		for i := range 30 {
			recs.completed(op, fmt.Sprintf("k%d", i), "", []byte("r"))
		}
		setEnv(t, b.env)
		var stdout, stderr bytes.Buffer
		a := &app{stdin: strings.NewReader(""), stdout: &stdout, stderr: &stderr, progressEvery: time.Nanosecond}
		if code := a.run(t.Context(), []string{"forget", "-operation", op, "-all", "-yes"}); code != exitOK {
			t.Fatalf("forget -all: exit %d\n%s%s", code, stdout.String(), stderr.String())
		}
		if !strings.Contains(stderr.String(), "of 30 (") || !strings.Contains(stderr.String(), "records of order.create forgotten so far") {
			t.Errorf("forget -all reported no progress:\n%s", stderr.String())
		}
	})
}

func TestPostgresForgetFileAndProgress(t *testing.T) {
	dsn, pool := postgresDB(t, true)
	if _, err := pool.Exec(t.Context(), `INSERT INTO idempotency_records (operation, key, state, token, result, expires_at)
		SELECT 'bulk.op', 'k' || i, 'completed', 't', 'r', clock_timestamp() + interval '1 hour' FROM generate_series(1, 2500) i`); err != nil {
		t.Fatal(err)
	}
	var keys strings.Builder
	for i := 1; i <= 1500; i++ {
		fmt.Fprintf(&keys, "k%d\n", i)
	}
	setEnv(t, map[string]string{"IDEMPOTENCY_POSTGRES_URL": dsn})
	var stdout, stderr bytes.Buffer
	a := &app{stdin: strings.NewReader(keys.String()), stdout: &stdout, stderr: &stderr, progressEvery: time.Nanosecond}
	if code := a.run(t.Context(), []string{"forget", "-file", "-", "bulk.op"}); code != exitOK ||
		!strings.Contains(stdout.String(), "forgot 1500 of 1500 keys of bulk.op (0 absent)") ||
		!strings.Contains(stderr.String(), "1000 of 1500 (66%) keys of bulk.op so far, 1000 forgotten") {
		t.Fatalf("forget -file of 1500 keys: exit %d\n%s%s", code, stdout.String(), stderr.String())
	}
	stdout.Reset()
	stderr.Reset()
	if code := a.run(t.Context(), []string{"forget", "-operation", "bulk.op", "-all", "-yes"}); code != exitOK ||
		!strings.Contains(stdout.String(), "forgot 1000 records of bulk.op") ||
		!strings.Contains(stderr.String(), "1000 of 1000 (100%) records of bulk.op forgotten so far") {
		t.Fatalf("forget -all of the 1000 left: exit %d\n%s%s", code, stdout.String(), stderr.String())
	}
}

// A key named twice (in the file, or in the file and on the command line)
// is forgotten once and counted once: not called absent the second time.
// The progress counts the distinct keys. A file without a key is a usage
// error, and nothing is forgotten.
func TestForgetFileDuplicates(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		recs := newRecords(t, b, redisrepo.Format2)
		const op = "order.create"
		for _, k := range []string{"k1", "k2", "k3", "kept"} {
			recs.completed(op, k, "", []byte("r"))
		}
		file := filepath.Join(t.TempDir(), "keys.txt")
		if err := os.WriteFile(file, []byte("k1\nk1\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		r := idemctl(t, b.env, "", false, "forget", "-file", file, op)
		if want := "forgot 1 of 1 key of order.create (0 absent, 1 duplicate dropped)\n"; r.code != exitOK || r.stdout != want {
			t.Errorf("forget -file of k1 twice: exit %d, want %q:\n%s", r.code, want, r.output())
		}

		setEnv(t, b.env)
		var stdout, stderr bytes.Buffer
		a := &app{stdin: strings.NewReader("k2\n k3\nk2\r\nk3\n"), stdout: &stdout, stderr: &stderr, progressEvery: time.Nanosecond}
		if code := a.run(t.Context(), []string{"forget", "-file", "-", op, "k2"}); code != exitOK ||
			stdout.String() != "forgot 2 of 2 keys of order.create (0 absent, 3 duplicates dropped)\n" ||
			!strings.Contains(stderr.String(), "idemctl forget: 2 of 2 (100%) keys of order.create so far, 2 forgotten\n") {
			t.Errorf("forget -file - with repeated keys: exit %d\n%s%s", code, stdout.String(), stderr.String())
		}

		for _, body := range []string{"", "\n  \n\r\n"} {
			if err := os.WriteFile(file, []byte(body), 0o600); err != nil {
				t.Fatal(err)
			}
			r := idemctl(t, b.env, "", false, "forget", "-file", file, op, "kept")
			if want := "idemctl forget: -file: no keys in " + file + "\n"; r.code != exitUsage || !strings.HasPrefix(r.stderr, want) || r.stdout != "" {
				t.Errorf("forget -file of %q: exit %d, want %d and %q:\n%s", body, r.code, exitUsage, want, r.output())
			}
			r = idemctl(t, b.env, body, false, "forget", "-file", "-", op)
			if want := "idemctl forget: -file: no keys in - (stdin)\n"; r.code != exitUsage || !strings.HasPrefix(r.stderr, want) {
				t.Errorf("forget -file - of %q: exit %d, want %d and %q:\n%s", body, r.code, exitUsage, want, r.output())
			}
		}
		if st := recs.state(op, "kept"); st != idemstore.StateCompleted {
			t.Errorf("a refused forget -file forgot a key: %v", st)
		}
	})
}

// forgetAllStore is a recordStore whose forget -all walk returns its keys
// twice, as SCAN may: handled keys pass the count, forgotten ones do not.
type forgetAllStore struct{ recordStore }

func (forgetAllStore) count(context.Context, []string) ([]countEntry, error) {
	return []countEntry{{Operation: "op", Total: 4, Completed: 4}}, nil
}

func (forgetAllStore) forgetOperation(_ context.Context, _ string, batch func(done, forgotten int)) (int, error) {
	batch(2, 2)
	batch(4, 4)
	batch(6, 4) // the first two again: already gone
	batch(8, 4)
	return 4, nil
}

func (forgetAllStore) where() string { return "under prefix \"p:\" on test" }

// forget -all's progress counts the records it forgot, which never pass
// what it deleted, not the keys SCAN returned, which may.
func TestForgetAllProgressCountsForgotten(t *testing.T) {
	var stdout, stderr bytes.Buffer
	a := &app{stdout: &stdout, stderr: &stderr, progressEvery: time.Nanosecond}
	if code := a.forgetAll(t.Context(), forgetAllStore{}, "op", true); code != exitOK {
		t.Fatalf("forgetAll: exit %d\n%s%s", code, stdout.String(), stderr.String())
	}
	want := "idemctl forget: 2 of 4 (50%) records of op forgotten so far\n" +
		"idemctl forget: 4 of 4 (100%) records of op forgotten so far\n"
	if got, _, _ := strings.Cut(stderr.String(), "A forgotten key"); !strings.HasPrefix(got, want) || strings.Contains(got, "6 of 4") || strings.Contains(got, "8 of 4") {
		t.Errorf("progress:\n%s\nwant it to start with\n%s", stderr.String(), want)
	}
	if stdout.String() != "forgot 4 records of op under prefix \"p:\" on test\n" {
		t.Errorf("forgetAll said %q", stdout.String())
	}
}
