package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/idemkit/idempotency/coordinator/idemstore"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/coordinator"
	"github.com/idemkit/idempotency/internal/redistest"
	"github.com/idemkit/idempotency/redisrepo"
)

// fp is a fingerprint as coordinator.Fingerprint makes them.
const fp = "5e884898da28047151d0e56f8dc6292773603d0d6aabbdd62a11ef721d1542d8"

func TestCheck(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		r := idemctl(t, b.env, "", false, "check")
		if r.code != exitOK {
			t.Fatalf("check: exit %d\n%s", r.code, r.output())
		}
		for _, name := range variables() {
			if !regexp.MustCompile(`(?m)^  ` + name + ` `).MatchString(r.stdout) {
				t.Errorf("check does not print %s:\n%s", name, r.stdout)
			}
		}
		if !regexp.MustCompile(`IDEMPOTENCY_KEY_PREFIX +` + regexp.QuoteMeta(fmt.Sprintf("%q", b.prefix)) + ` +\(environment\)`).MatchString(r.stdout) {
			t.Errorf("check does not print the key prefix from the environment:\n%s", r.stdout)
		}
		wants := []string{"(default)", "redis_version 7.", "\nOK\n"}
		if redistest.ServerKind(t) == redistest.KindMiniredis {
			wants = []string{"(default)", "\nOK\n"} // miniredis has no version of Redis's
		}
		for _, want := range wants {
			if !strings.Contains(r.stdout, want) {
				t.Errorf("check's output lacks %q:\n%s", want, r.stdout)
			}
		}
		// The Redis is named as the settings name it (Settings.RedisAddr).
		label := "Redis " + redistest.ServerOptions(t).Addr + ":\n"
		if _, cluster := b.env["IDEMPOTENCY_REDIS_CLUSTER_ADDRS"]; cluster {
			label = "Redis cluster " + strings.Join(redistest.ClusterAddrs(t), ",") + ":\n"
		}
		if !strings.Contains(r.stdout, "\n"+label) {
			t.Errorf("check does not name the Redis %q:\n%s", label, r.stdout)
		}
		if _, cluster := b.env["IDEMPOTENCY_REDIS_CLUSTER_ADDRS"]; cluster {
			for _, addr := range redistest.ClusterAddrs(t) {
				if !strings.Contains(r.stdout, "master "+addr+": PONG") {
					t.Errorf("check does not report master %s:\n%s", addr, r.stdout)
				}
			}
			if !strings.Contains(r.stdout, "3 masters, every one reachable, cluster_state ok") {
				t.Errorf("check does not report the cluster's state:\n%s", r.stdout)
			}
		}

		// A flag overrides its variable, and says so.
		r = idemctl(t, b.env, "", false, "check", "-key-prefix", "other:")
		if r.code != exitOK || !strings.Contains(r.stdout, `"other:"`) || !strings.Contains(r.stdout, "(flag -key-prefix)") {
			t.Errorf("check -key-prefix other: exit %d\n%s", r.code, r.output())
		}
	})
}

func TestCheckInvalidSettings(t *testing.T) {
	good := map[string]string{"IDEMPOTENCY_REDIS_URL": "redis://" + redistest.ServerOptions(t).Addr + "/0"}
	for _, tc := range []struct {
		name string
		env  map[string]string
		args []string
		want string // in stderr
	}{
		{"unparsable", with(good, "IDEMPOTENCY_LEASE", "forever"), nil, "IDEMPOTENCY_LEASE"},
		{"out of range", with(good, "IDEMPOTENCY_LEASE", "1s", "IDEMPOTENCY_STORAGE_TIMEOUT", "5s"), nil, "IDEMPOTENCY_LEASE"},
		{"unknown variable", with(good, "IDEMPOTENCY_ON_STORAGE_ERRORS", "raise"), nil, "did you mean IDEMPOTENCY_ON_STORAGE_ERROR?"},
		{"bad URL", with(good, "IDEMPOTENCY_REDIS_URL", "http://localhost:6379"), nil, "IDEMPOTENCY_REDIS_URL"},
		{"bad URL flag", good, []string{"-redis-url", "localhost:6379"}, "IDEMPOTENCY_REDIS_URL"},
		{"bad cluster flag", good, []string{"-cluster-addrs", "localhost"}, "IDEMPOTENCY_REDIS_CLUSTER_ADDRS"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, cmd := range [][]string{{"check"}, {"lookup", "op", "k"}, {"forget", "op", "k"}, {"count"}} {
				r := idemctl(t, tc.env, "", false, append(cmd, tc.args...)...)
				if r.code != exitFailure || !strings.Contains(r.stderr, tc.want) {
					t.Errorf("%s: exit %d, want %d and an error naming %s:\n%s", cmd[0], r.code, exitFailure, tc.want, r.output())
				}
			}
		})
	}
}

// An unreachable Redis fails every command, within a few storage timeouts.
func TestUnreachable(t *testing.T) {
	for _, env := range []map[string]string{
		{"IDEMPOTENCY_REDIS_URL": "redis://127.0.0.1:1/0", "IDEMPOTENCY_STORAGE_TIMEOUT": "300ms"},
		{"IDEMPOTENCY_REDIS_CLUSTER_ADDRS": "127.0.0.1:1,127.0.0.1:2", "IDEMPOTENCY_STORAGE_TIMEOUT": "300ms"},
		{"IDEMPOTENCY_REDIS_SENTINEL_MASTER": "m", "IDEMPOTENCY_REDIS_SENTINEL_ADDRS": "127.0.0.1:1,127.0.0.1:2", "IDEMPOTENCY_STORAGE_TIMEOUT": "300ms"},
	} {
		for _, cmd := range [][]string{{"check"}, {"lookup", "op", "k"}, {"forget", "op", "k"}, {"forget", "-operation", "op", "-all", "-yes"}, {"count"}} {
			start := time.Now()
			r := idemctl(t, env, "", false, cmd...)
			if took := time.Since(start); took > 3*time.Second {
				t.Errorf("%v against %v took %v", cmd, env, took)
			}
			if r.code != exitFailure || !strings.Contains(r.output(), "127.0.0.1:1") || strings.Contains(r.output(), "FailoverClient") {
				t.Errorf("%v against %v: exit %d, want %d and the address:\n%s", cmd, env, r.code, exitFailure, r.output())
			}
		}
	}
}

// The password of the Redis URL never shows, in any output: of the settings,
// of errors, of a refused password.
func TestPasswordNeverShown(t *testing.T) {
	const password = "pw9Xq7Lm2Vb4-Tz"
	p, err := redistest.StartProcess(t.TempDir())
	if err != nil {
		t.Skipf("cannot start a redis-server of this test's own: %v", err)
	}
	t.Cleanup(p.Kill)
	c := redis.NewClient(&redis.Options{Addr: p.Addr()})
	err = c.ConfigSet(t.Context(), "requirepass", password).Err()
	_ = c.Close()
	if err != nil {
		t.Fatal(err)
	}
	url := "redis://:" + password + "@" + p.Addr() + "/0"
	env := map[string]string{"IDEMPOTENCY_REDIS_URL": url, "IDEMPOTENCY_KEY_PREFIX": redistest.Prefix(t)}
	wrong := map[string]string{"IDEMPOTENCY_REDIS_URL": "redis://:" + password + "-wrong@" + p.Addr() + "/0"}
	down := map[string]string{"IDEMPOTENCY_REDIS_URL": "redis://user:" + password + "@127.0.0.1:1/0"}
	invalid := map[string]string{"IDEMPOTENCY_REDIS_URL": url + "?pool_size=" + password}
	unsplittable := map[string]string{"IDEMPOTENCY_REDIS_URL": "redis://:" + password + "/x@" + p.Addr() + "/0"}

	for _, tc := range []struct {
		env  map[string]string
		args []string
		code int
	}{
		{env, []string{"check"}, exitOK},
		{env, []string{"lookup", "-json", "op", "k"}, exitOK},
		{env, []string{"lookup", "op", "k"}, exitOK},
		{env, []string{"forget", "op", "k"}, exitOK},
		{env, []string{"count"}, exitOK},
		{env, []string{"count", "-redis-url", url + "?pool_size=x"}, exitFailure},
		{wrong, []string{"check"}, exitFailure},
		{wrong, []string{"count"}, exitFailure},
		{down, []string{"check"}, exitFailure},
		{down, []string{"lookup", "op", "k"}, exitFailure},
		{invalid, []string{"check"}, exitFailure},
		{unsplittable, []string{"check"}, exitFailure},
		{map[string]string{}, []string{"check", "-redis-url", url}, exitOK},
	} {
		r := idemctl(t, tc.env, "", false, tc.args...)
		if r.code != tc.code {
			t.Errorf("%v: exit %d, want %d:\n%s", tc.args, r.code, tc.code, r.output())
		}
		// Not the password, nor any 5 bytes of it.
		for i := 0; i+5 <= len(password); i++ {
			if part := password[i : i+5]; strings.Contains(r.output(), part) {
				t.Errorf("%v: the output shows %q of the password:\n%s", tc.args, part, r.output())
				break
			}
		}
	}
}

func TestLookup(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		recs := newRecords(t, b, redisrepo.Format2)
		const op = "payment.charge"
		recs.completed(op, "order-42", fp, []byte(`{"id":"ch_1"}`))
		recs.completed(op, "a:b*[c]", "", []byte{0xff, 0x00, 0x1b, '['})
		recs.completed(op, "-dash", "", []byte("line 1\nline 2\x1b[31m"))
		recs.pending(op, "order-43")
		recs.notReplayable(op, "big", "the result is 2097152 bytes, more than the limit of 1048576")

		r := idemctl(t, b.env, "", false, "lookup", "-result", op, "order-42", "a:b*[c]", "order-43", "absent", "big", "--", "-dash")
		if r.code != exitOK {
			t.Fatalf("lookup: exit %d\n%s", r.code, r.output())
		}
		for _, want := range []string{
			"payment.charge order-42\n  redis key    " + b.prefix + "payment.charge:order-42\n  state        completed\n",
			"  fingerprint  " + fp + "\n  owner token  present\n  result size  13 bytes\n  result       text: {\"id\":\"ch_1\"}\n",
			"payment.charge a:b*[c]\n",
			"  result       base64: " + base64.StdEncoding.EncodeToString([]byte{0xff, 0x00, 0x1b, '['}) + "\n",
			"payment.charge order-43\n  redis key    " + b.prefix + "payment.charge:order-43\n  state        pending\n",
			"payment.charge absent\n  redis key    " + b.prefix + "payment.charge:absent\n  state        absent\n",
			`  result       quoted: "line 1\nline 2\x1b[31m"` + "\n",
			"payment.charge big\n  redis key    " + b.prefix + "payment.charge:big\n  state        not_replayable\n",
			"  reason       the result is 2097152 bytes, more than the limit of 1048576\n",
		} {
			if !strings.Contains(r.stdout, want) {
				t.Errorf("lookup's output lacks %q:\n%s", want, r.stdout)
			}
		}
		if strings.IndexFunc(r.stdout, func(r rune) bool { return r != '\n' && (r < 0x20 || r == utf8.RuneError) }) >= 0 {
			t.Errorf("lookup writes control bytes:\n%q", r.stdout)
		}
		if regexp.MustCompile(`(?s)order-43.*result`).MatchString(strings.Split(r.stdout, "payment.charge absent")[0]) {
			t.Errorf("lookup prints a result for a pending key:\n%s", r.stdout)
		}
		if !regexp.MustCompile(`order-42\n(.*\n)*  ttl          59m5\d(\.\d+)?s\n`).MatchString(r.stdout) {
			t.Errorf("lookup does not print order-42's TTL:\n%s", r.stdout)
		}

		// Without -result, no result; with -result-format hex, hex.
		r = idemctl(t, b.env, "", false, "lookup", op, "order-42")
		if strings.Contains(r.stdout, "ch_1") {
			t.Errorf("lookup without -result prints the result:\n%s", r.stdout)
		}
		r = idemctl(t, b.env, "", false, "lookup", op, "order-42", "-result", "-result-format", "hex")
		if !strings.Contains(r.stdout, "  result       hex: 7b226964223a2263685f31227d\n") {
			t.Errorf("lookup -result-format hex:\n%s", r.output())
		}

		// -json
		r = idemctl(t, b.env, "", false, "lookup", "-json", "-result", op, "order-42", "a:b*[c]", "order-43", "absent")
		if r.code != exitOK {
			t.Fatalf("lookup -json: exit %d\n%s", r.code, r.output())
		}
		var got []lookupEntry
		if err := json.Unmarshal([]byte(r.stdout), &got); err != nil {
			t.Fatalf("lookup -json: %v\n%s", err, r.stdout)
		}
		if len(got) != 4 {
			t.Fatalf("lookup -json: %d entries, want 4:\n%s", len(got), r.stdout)
		}
		check := func(e lookupEntry, key, state string, token bool, size int, result, enc string) {
			t.Helper()
			res := ""
			if e.Result != nil {
				res = *e.Result
			}
			if e.Operation != op || e.Key != key || e.RedisKey != b.prefix+op+":"+key || e.State != state || e.Token != token ||
				e.ResultSize != size || res != result || e.ResultEncoding != enc {
				t.Errorf("lookup -json: %+v (result %q), want key %s, state %s, token %v, result %q (%s)", e, res, key, state, token, result, enc)
			}
		}
		check(got[0], "order-42", "completed", true, 13, `{"id":"ch_1"}`, "text")
		check(got[1], "a:b*[c]", "completed", true, 4, base64.StdEncoding.EncodeToString([]byte{0xff, 0x00, 0x1b, '['}), "base64")
		check(got[2], "order-43", "pending", true, 0, "", "")
		check(got[3], "absent", "absent", false, 0, "", "")
		if got[0].Fingerprint != fp || got[0].TTLMillis == nil || *got[0].TTLMillis < 59*60*1000 || *got[0].TTLMillis > 3600*1000 {
			t.Errorf("lookup -json: %+v, want fingerprint %s and a TTL of about an hour", got[0], fp)
		}
		if got[2].TTLMillis == nil || *got[2].TTLMillis <= 0 || got[3].TTLMillis != nil {
			t.Errorf("lookup -json: TTLs %v and %v, want the lease and null", got[2].TTLMillis, got[3].TTLMillis)
		}
		if !strings.Contains(r.stdout, `"ttl_ms": null`) {
			t.Errorf("lookup -json: an absent key's ttl_ms is not null:\n%s", r.stdout)
		}

		// Usage errors.
		for _, args := range [][]string{
			{"lookup", op},
			{"lookup", "bad:op", "k"},
			{"lookup", op, "has space"},
			{"lookup", "-result-format", "octal", op, "k"},
			{"lookup", "-nope", op, "k"},
		} {
			if r := idemctl(t, b.env, "", false, args...); r.code != exitUsage || !strings.Contains(r.stderr, "Usage: idemctl lookup") {
				t.Errorf("%q: exit %d, want %d with the usage:\n%s", args, r.code, exitUsage, r.output())
			}
		}
	})
}

func TestForget(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		recs := newRecords(t, b, redisrepo.Format2)
		const op = "order.create"
		for i := range 30 {
			recs.completed(op, fmt.Sprintf("k%d:*", i), "", []byte("r"))
		}
		recs.pending(op, "held")
		recs.completed("order.create.v2", "k1:*", "", []byte("r")) // another operation, with op as a prefix
		recs.completed("order", "create:k1:*", "", []byte("r"))    // the same Redis key but for the colon

		// One key, then several.
		r := idemctl(t, b.env, "", false, "forget", op, "k0:*")
		if r.code != exitOK || !strings.Contains(r.stdout, "forgot 1 of 1 key of order.create") || !strings.Contains(r.stderr, "run its action AGAIN") {
			t.Errorf("forget one: exit %d\n%s", r.code, r.output())
		}
		if st := recs.state(op, "k0:*"); st != idemstore.StateAbsent {
			t.Errorf("forgotten key is %v", st)
		}
		r = idemctl(t, b.env, "", false, "forget", op, "k0:*", "k1:*", "k2:*")
		if r.code != exitOK || !strings.Contains(r.stdout, "forgot 2 of 3 keys of order.create (1 absent)") {
			t.Errorf("forget three: exit %d\n%s", r.code, r.output())
		}
		// A forgotten key runs its action again.
		ran := false
		if _, err := recs.c.Execute(t.Context(), coordinator.Call{Operation: op, Key: "k1:*"}, func(context.Context) ([]byte, error) {
			ran = true
			return []byte("again"), nil
		}); err != nil || !ran {
			t.Errorf("a forgotten key: ran %v, %v; want the action run again", ran, err)
		}

		// -all: refused without a terminal and without -yes; not confirmed;
		// nothing is deleted.
		left := 30 - 3 + 1 + 1 // k3..k29, k1 again, held
		r = idemctl(t, b.env, "", false, "forget", "-operation", op, "-all")
		if r.code != exitUsage || !strings.Contains(r.stderr, fmt.Sprintf("refusing to forget %d records of order.create without -yes", left)) {
			t.Errorf("forget -all without a terminal: exit %d\n%s", r.code, r.output())
		}
		r = idemctl(t, b.env, "yes\n", true, "forget", "-all", "-operation", op)
		if r.code != exitFailure || !strings.Contains(r.stderr, "Type the operation name (order.create)") || !strings.Contains(r.stderr, "nothing forgotten") {
			t.Errorf("forget -all answered yes: exit %d\n%s", r.code, r.output())
		}
		if !strings.Contains(r.stderr, fmt.Sprintf("About to forget %d records of order.create under prefix %q", left, b.prefix)) ||
			!strings.Contains(r.stderr, "(1 pending, ") || !strings.Contains(r.stderr, "run its action AGAIN") {
			t.Errorf("forget -all's prompt:\n%s", r.stderr)
		}
		if n := count(t, b, op); n != left {
			t.Fatalf("%d records left after refusals, want %d", n, left)
		}

		// Confirmed by the operation's name.
		r = idemctl(t, b.env, op+"\n", true, "forget", "-all", "-operation", op)
		if r.code != exitOK || !strings.Contains(r.stdout, fmt.Sprintf("forgot %d records of order.create", left)) {
			t.Errorf("forget -all confirmed: exit %d\n%s", r.code, r.output())
		}
		if n := count(t, b, op); n != 0 {
			t.Errorf("%d records left after forget -all", n)
		}
		for _, k := range []idemstore.Key{{Operation: "order.create.v2", Key: "k1:*"}, {Operation: "order", Key: "create:k1:*"}} {
			if st := recs.state(k.Operation, k.Key); st != idemstore.StateCompleted {
				t.Errorf("forget -all of %s forgot %v", op, k)
			}
		}

		// -yes, no terminal needed; then nothing to forget.
		recs.completed(op, "again", "", []byte("r"))
		r = idemctl(t, b.env, "", false, "forget", "-operation", op, "-all", "-yes")
		if r.code != exitOK || !strings.Contains(r.stdout, "forgot 1 record of order.create") || !strings.Contains(r.stderr, "run its action AGAIN") {
			t.Errorf("forget -all -yes: exit %d\n%s", r.code, r.output())
		}
		r = idemctl(t, b.env, "", false, "forget", "-operation", op, "-all", "-yes")
		if r.code != exitOK || !strings.Contains(r.stdout, "nothing to forget") {
			t.Errorf("forget -all -yes of nothing: exit %d\n%s", r.code, r.output())
		}

		for _, args := range [][]string{
			{"forget", op},
			{"forget", "-all"},
			{"forget", "-all", op},
			{"forget", "-operation", op, "-all", "k"},
			{"forget", "-yes", op, "k"},
			{"forget", "bad op", "k"},
		} {
			if r := idemctl(t, b.env, "", false, args...); r.code != exitUsage {
				t.Errorf("%q: exit %d, want %d:\n%s", args, r.code, exitUsage, r.output())
			}
		}
	})
}

// count returns the number of records of op, counted by the store.
func count(t *testing.T, b backend, op string) int {
	t.Helper()
	counts, err := redisrepo.New(b.client, redisrepo.WithKeyPrefix(b.prefix)).Count(t.Context(), op)
	if err != nil {
		t.Fatal(err)
	}
	return counts[op].Total()
}

func TestCount(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		r := idemctl(t, b.env, "", false, "count")
		if r.code != exitOK || !strings.Contains(r.stdout, "no records under prefix") {
			t.Errorf("count of nothing: exit %d\n%s", r.code, r.output())
		}

		recs := newRecords(t, b, redisrepo.Format2)
		old := newRecords(t, b, redisrepo.Format1)
		for i := range 5 {
			recs.completed("payment.charge", fmt.Sprint("k:", i), fp, []byte("r"))
		}
		recs.pending("payment.charge", "held")
		old.completed("payment.charge", "old", "", []byte("r"))
		old.pending("payment.charge", "old-held")
		recs.completed("order.create", "k", "", nil)
		recs.notReplayable("order.create", "big", "the result is 2097152 bytes, more than the limit of 1048576")
		if err := b.client.Set(t.Context(), b.prefix+"order.create:junk", "not a record", time.Minute).Err(); err != nil {
			t.Fatal(err)
		}

		r = idemctl(t, b.env, "", false, "count")
		want := "operation       total  pending  completed  not_replayable  unreadable  format1\n" +
			"order.create    3      0        2          1               1           0\n" +
			"payment.charge  8      2        6          0               0           2\n" +
			"(all)           11     2        8          1               1           2\n"
		if r.code != exitOK || r.stdout != want {
			t.Errorf("count: exit %d\n%s\nwant\n%s", r.code, r.output(), want)
		}

		r = idemctl(t, b.env, "", false, "count", "-json", "payment.charge", "none")
		var got struct {
			Prefix     string       `json:"prefix"`
			Operations []countEntry `json:"operations"`
		}
		if err := json.Unmarshal([]byte(r.stdout), &got); err != nil || r.code != exitOK {
			t.Fatalf("count -json: exit %d, %v\n%s", r.code, err, r.output())
		}
		wantJSON := []countEntry{{Operation: "none"}, {Operation: "payment.charge", Total: 8, Pending: 2, Completed: 6, Format1: 2}}
		if got.Prefix != b.prefix || fmt.Sprint(got.Operations) != fmt.Sprint(wantJSON) {
			t.Errorf("count -json = %+v, want prefix %q and %+v", got, b.prefix, wantJSON)
		}

		if r := idemctl(t, b.env, "", false, "count", "bad:op"); r.code != exitUsage {
			t.Errorf("count bad:op: exit %d, want %d:\n%s", r.code, exitUsage, r.output())
		}
	})
}

// The glob characters of a prefix are escaped: a prefix that would match
// another's keys as a pattern sees its own only.
func TestGlobPrefix(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		mine := b
		mine.prefix = b.prefix + "[a-z]*:"
		mine.env = with(b.env, "IDEMPOTENCY_KEY_PREFIX", mine.prefix)
		other := b
		other.prefix = b.prefix + "x:"
		newRecords(t, mine, redisrepo.Format2).completed("op", "k", "", []byte("r"))
		newRecords(t, other, redisrepo.Format2).completed("op", "k", "", []byte("r"))

		r := idemctl(t, mine.env, "", false, "count", "-json")
		if r.code != exitOK || !strings.Contains(r.stdout, `"total": 1,`) {
			t.Errorf("count: exit %d\n%s", r.code, r.output())
		}
		r = idemctl(t, mine.env, "", false, "forget", "-operation", "op", "-all", "-yes")
		if r.code != exitOK || !strings.Contains(r.stdout, "forgot 1 record of op") {
			t.Errorf("forget -all: exit %d\n%s", r.code, r.output())
		}
		if n := count(t, other, "op"); n != 1 {
			t.Errorf("the other prefix has %d records, want 1", n)
		}
	})
}

// TestUsage covers the commands' usage errors that need no Redis.
func TestUsage(t *testing.T) {
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{nil, exitUsage, "Usage:"},
		{[]string{"nope"}, exitUsage, `unknown command "nope"`},
		{[]string{"help"}, exitOK, "A forgotten key lets the next call with it run its action AGAIN"},
		{[]string{"check", "extra"}, exitUsage, "no arguments expected"},
		{[]string{"count", "-h"}, exitOK, "Usage: idemctl count"},
	} {
		r := idemctl(t, nil, "", false, tc.args...)
		if r.code != tc.code || !strings.Contains(r.output(), tc.want) {
			t.Errorf("%q: exit %d, want %d and %q:\n%s", tc.args, r.code, tc.code, tc.want, r.output())
		}
	}
}

// isTerminal: a pipe and a file are not terminals.
func TestIsTerminal(t *testing.T) {
	f, err := os.Create(filepath.Join(t.TempDir(), "stdin"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if isTerminal(f) || isTerminal(strings.NewReader("")) {
		t.Error("a file or a reader is a terminal")
	}
	null, err := os.Open(os.DevNull)
	if err != nil {
		t.Fatal(err)
	}
	defer null.Close()
	if isTerminal(null) {
		t.Errorf("%s, a character device, is a terminal", os.DevNull)
	}
}

// A server older than Redis 7.0 fails check: every call of the store would
// fail on it. The servers' INFO is rewritten to say 6.2.14.
func TestCheckOldRedis(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		setEnv(t, b.env)
		var stdout, stderr bytes.Buffer
		a := &app{stdin: strings.NewReader(""), stdout: &stdout, stderr: &stderr, newClient: withVersion("6.2.14")}
		code := a.run(t.Context(), []string{"check"})
		out := stdout.String() + stderr.String()
		if code != exitFailure || !strings.Contains(stdout.String(), "\nFAILED\n") || !strings.Contains(stderr.String(), "Redis failed the check") {
			t.Errorf("check of Redis 6.2.14: exit %d, want %d and FAILED:\n%s", code, exitFailure, out)
		}
		addrs := []string{redistest.ServerOptions(t).Addr}
		if _, cluster := b.env["IDEMPOTENCY_REDIS_CLUSTER_ADDRS"]; cluster {
			addrs = redistest.ClusterAddrs(t)
		}
		for _, addr := range addrs {
			if want := "  FAILED: " + addr + " runs Redis 6.2.14: the store needs Redis 7.0 or newer"; !strings.Contains(out, want) {
				t.Errorf("check does not say %q:\n%s", want, out)
			}
		}

		// The same servers, as they are, pass.
		stdout.Reset()
		stderr.Reset()
		a.newClient = withVersion("7.0.0")
		if code := a.run(t.Context(), []string{"check"}); code != exitOK {
			t.Errorf("check of Redis 7.0.0: exit %d:\n%s%s", code, stdout.String(), stderr.String())
		}
	})
}

// On Valkey, check prints valkey_version after redis_version (which Valkey
// sets to the Redis release it is compatible with, 7.2.4 for Valkey 8); on
// Redis it prints no valkey_version. The servers' INFO is rewritten to say
// valkey_version 8.0.1; on a real Valkey (IDEMPOTENCY_TEST_REDIS_SERVER) the
// check's plain output says its own.
func TestCheckValkeyVersion(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		setEnv(t, b.env)
		var stdout, stderr bytes.Buffer
		a := &app{stdin: strings.NewReader(""), stdout: &stdout, stderr: &stderr, newClient: withInfo("valkey_version", "8.0.1")}
		if code := a.run(t.Context(), []string{"check"}); code != exitOK {
			t.Fatalf("check: exit %d:\n%s%s", code, stdout.String(), stderr.String())
		}
		if n, want := strings.Count(stdout.String(), ", valkey_version 8.0.1"), strings.Count(stdout.String(), ": PONG in "); n != want || n == 0 {
			t.Errorf("check: %d servers with valkey_version 8.0.1, want every one (%d):\n%s", n, want, stdout.String())
		}

		r := idemctl(t, b.env, "", false, "check")
		want := ""
		if redistest.ServerKind(t) == redistest.KindRedisServer {
			if sb := redistest.ServerBinary(t); sb.Product == "Valkey" {
				want = ", valkey_version " + sb.Version
			}
		}
		if got := strings.Contains(r.stdout, ", valkey_version "); got != (want != "") || !strings.Contains(r.stdout, want) {
			t.Errorf("check on %s: want valkey_version %q in:\n%s", redistest.ServerKind(t), want, r.stdout)
		}
	})
}

// withVersion returns a newClient whose clients see version as the
// redis_version of every server's INFO.
func withVersion(version string) func(idempotency.Settings) (redis.UniversalClient, error) {
	return withInfo("redis_version", version)
}

// withInfo returns a newClient whose clients see value as the field of
// every server's INFO.
func withInfo(field, value string) func(idempotency.Settings) (redis.UniversalClient, error) {
	return func(s idempotency.Settings) (redis.UniversalClient, error) {
		c, err := idempotency.NewRedisClient(s)
		if err != nil {
			return nil, err
		}
		h := infoHook{field, value}
		switch c := c.(type) {
		case *redis.ClusterClient:
			c.OnNewNode(func(node *redis.Client) { node.AddHook(h) })
		case *redis.Client:
			c.AddHook(h)
		}
		return c, nil
	}
}

// infoHook rewrites a field of INFO replies (or adds it: miniredis's INFO
// has no redis_version).
type infoHook struct{ field, value string }

func (infoHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h infoHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	re := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(h.field) + `:[^\r\n]*`)
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if c, ok := cmd.(*redis.StringCmd); ok && err == nil && cmd.Name() == "info" {
			info := c.Val()
			if re.MatchString(info) {
				info = re.ReplaceAllLiteralString(info, h.field+":"+h.value)
			} else {
				info = h.field + ":" + h.value + "\r\n" + info
			}
			c.SetVal(info)
		}
		return err
	}
}

func (infoHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// Every command works on Redis Sentinel: check names the setup, checks
// every sentinel and the master they name; the others reach the master
// through the failover client, as the module does. "FailoverClient", the
// address go-redis gives a failover client, never shows.
func TestSentinel(t *testing.T) {
	sn := redistest.StartSentinel(t)
	master, err := sn.Master(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	sentinel := sn.Addrs()[0]
	prefix := redistest.Prefix(t)
	env := map[string]string{
		"IDEMPOTENCY_REDIS_SENTINEL_MASTER": redistest.SentinelMaster,
		"IDEMPOTENCY_REDIS_SENTINEL_ADDRS":  strings.Join(sn.Addrs(), ","),
		"IDEMPOTENCY_KEY_PREFIX":            prefix,
	}
	label := "Redis sentinel master " + redistest.SentinelMaster + " via " + sentinel + ":\n"
	noFailoverClient := func(r result) {
		t.Helper()
		if strings.Contains(r.output(), "FailoverClient") {
			t.Errorf("the output calls the Redis FailoverClient:\n%s", r.output())
		}
	}

	r := idemctl(t, env, "", false, "check")
	noFailoverClient(r)
	for _, want := range []string{
		"\n" + label,
		"  sentinel " + sentinel + ": PONG in ",
		", master " + redistest.SentinelMaster + " at " + master + "\n",
		"  master " + master + ": PONG in ",
		", redis_version 7.",
		", role master\n",
		"  1 sentinel, every one answering; master " + redistest.SentinelMaster + " at " + master + "\nOK\n",
	} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("check's output lacks %q:\n%s", want, r.output())
		}
	}
	if r.code != exitOK {
		t.Errorf("check: exit %d", r.code)
	}

	// The records on the master, through the failover client.
	b := backend{
		client: redis.NewClient(&redis.Options{Addr: master}),
		env:    env,
		prefix: prefix,
	}
	t.Cleanup(func() { _ = b.client.Close() })
	newRecords(t, b, redisrepo.Format2).completed("op", "k", "", []byte("r"))
	r = idemctl(t, env, "", false, "lookup", "op", "k", "absent")
	noFailoverClient(r)
	if r.code != exitOK || !strings.Contains(r.stdout, "op k\n  redis key    "+prefix+"op:k\n  state        completed\n") {
		t.Errorf("lookup: exit %d\n%s", r.code, r.output())
	}
	r = idemctl(t, env, "", false, "count")
	noFailoverClient(r)
	if r.code != exitOK || !strings.Contains(r.stdout, "op         1      0        1          0               0           0\n") {
		t.Errorf("count: exit %d\n%s", r.code, r.output())
	}
	r = idemctl(t, env, "", false, "forget", "-operation", "op", "-all", "-yes")
	noFailoverClient(r)
	if want := fmt.Sprintf("forgot 1 record of op under prefix %q on sentinel master %s via %s\n", prefix, redistest.SentinelMaster, sentinel); r.code != exitOK || r.stdout != want {
		t.Errorf("forget -all: exit %d, want %q:\n%s", r.code, want, r.output())
	}
	r = idemctl(t, env, "", false, "count")
	if want := fmt.Sprintf("no records under prefix %q on sentinel master %s via %s\n", prefix, redistest.SentinelMaster, sentinel); r.code != exitOK || r.stdout != want {
		t.Errorf("count after forget: exit %d, want %q:\n%s", r.code, want, r.output())
	}

	// A listed sentinel that does not answer fails the check, though the
	// client works through the other.
	r = idemctl(t, with(env, "IDEMPOTENCY_REDIS_SENTINEL_ADDRS", sentinel+",127.0.0.1:1", "IDEMPOTENCY_STORAGE_TIMEOUT", "300ms"), "", false, "check")
	noFailoverClient(r)
	if r.code != exitFailure || !strings.Contains(r.stdout, "  sentinel 127.0.0.1:1: FAILED: ping: dial tcp 127.0.0.1:1: connect: connection refused\n") ||
		!strings.Contains(r.stdout, "  master "+master+": PONG in ") || !strings.Contains(r.stdout, "\nFAILED\n") {
		t.Errorf("check with a sentinel down: exit %d, want %d:\n%s", r.code, exitFailure, r.output())
	}

	// A master name the sentinels do not know: nothing works.
	unknown := with(env, "IDEMPOTENCY_REDIS_SENTINEL_MASTER", "nope")
	r = idemctl(t, unknown, "", false, "check")
	noFailoverClient(r)
	if r.code != exitFailure || !strings.Contains(r.stdout, "  sentinel "+sentinel+`: FAILED: it monitors no master named "nope"`) ||
		!strings.Contains(r.stdout, "  master (no sentinel named it): FAILED: IDEMPOTENCY_REDIS_SENTINEL_MASTER: no sentinel that answered (of "+sentinel+`) monitors a master named "nope"`) {
		t.Errorf("check of an unknown master: exit %d, want %d:\n%s", r.code, exitFailure, r.output())
	}
	// The sentinels answered: a name they do not know is a
	// misconfiguration (waiting does not mend it), not an outage, and the
	// error names the variable to change, as for refused credentials.
	for _, cmd := range [][]string{{"count"}, {"lookup", "op", "k"}, {"forget", "op", "k"}} {
		r = idemctl(t, unknown, "", false, cmd...)
		noFailoverClient(r)
		want := "idemctl " + cmd[0] + `: IDEMPOTENCY_REDIS_SENTINEL_MASTER: no sentinel that answered (of ` + sentinel + `) monitors a master named "nope"`
		if r.code != exitFailure || !strings.HasPrefix(r.stderr, want) || strings.Contains(r.stderr, "unreachable") {
			t.Errorf("%v of an unknown master: exit %d, want %d and %q:\n%s", cmd, r.code, exitFailure, want, r.output())
		}
	}

	// A master that is no master (here, says it is a replica) fails.
	setEnv(t, env)
	var stdout, stderr bytes.Buffer
	a := &app{stdin: strings.NewReader(""), stdout: &stdout, stderr: &stderr, newClient: withInfo("role", "slave")}
	if code := a.run(t.Context(), []string{"check"}); code != exitFailure ||
		!strings.Contains(stdout.String(), "  master "+master+": FAILED: role slave, not master: writes would fail with READONLY\n") {
		t.Errorf("check of a master with role slave: exit %d, want %d:\n%s%s", code, exitFailure, stdout.String(), stderr.String())
	}
}

// The sentinels' password never shows either: not in the settings, not in
// the errors of sentinels that refuse a wrong one.
func TestSentinelPasswordNeverShown(t *testing.T) {
	const password = "Zq8Wm3vKp2Xr7Jd"
	sn := redistest.StartSentinel(t)
	sc := redis.NewSentinelClient(&redis.Options{Addr: sn.Addrs()[0]})
	err := sc.Process(t.Context(), redis.NewStatusCmd(t.Context(), "acl", "setuser", "default", "on", ">"+password))
	_ = sc.Close()
	if err != nil {
		t.Fatalf("set the sentinel's password: %v", err)
	}
	env := map[string]string{
		"IDEMPOTENCY_REDIS_SENTINEL_MASTER":   redistest.SentinelMaster,
		"IDEMPOTENCY_REDIS_SENTINEL_ADDRS":    strings.Join(sn.Addrs(), ","),
		"IDEMPOTENCY_REDIS_SENTINEL_PASSWORD": password,
		"IDEMPOTENCY_KEY_PREFIX":              redistest.Prefix(t),
	}
	wrong := with(env, "IDEMPOTENCY_REDIS_SENTINEL_PASSWORD", password+"-wrong")
	for _, tc := range []struct {
		env  map[string]string
		args []string
		code int
	}{
		{env, []string{"check"}, exitOK},
		{env, []string{"count"}, exitOK},
		{env, []string{"lookup", "op", "k"}, exitOK},
		{wrong, []string{"check"}, exitFailure},
		{wrong, []string{"count"}, exitFailure},
		{wrong, []string{"forget", "op", "k"}, exitFailure},
	} {
		r := idemctl(t, tc.env, "", false, tc.args...)
		if r.code != tc.code {
			t.Errorf("%v: exit %d, want %d:\n%s", tc.args, r.code, tc.code, r.output())
		}
		for i := 0; i+5 <= len(password); i++ {
			if part := password[i : i+5]; strings.Contains(r.output(), part) {
				t.Errorf("%v: the output shows %q of the password:\n%s", tc.args, part, r.output())
				break
			}
		}
		if tc.args[0] == "check" && !regexp.MustCompile(`IDEMPOTENCY_REDIS_SENTINEL_PASSWORD +xxxxx +\(environment\)`).MatchString(r.stdout) {
			t.Errorf("check does not show the sentinels' password masked:\n%s", r.stdout)
		}
		if tc.args[0] == "check" && tc.code == exitFailure && !strings.Contains(r.stdout, "WRONGPASS") {
			t.Errorf("check does not say the sentinel refused the password:\n%s", r.stdout)
		}
		// The other commands say which variables hold the credentials.
		if want := "IDEMPOTENCY_REDIS_URL or IDEMPOTENCY_REDIS_SENTINEL_PASSWORD: redis at sentinel master " + redistest.SentinelMaster +
			" via " + env["IDEMPOTENCY_REDIS_SENTINEL_ADDRS"] + " refused the credentials"; tc.args[0] != "check" && tc.code == exitFailure && !strings.Contains(r.stderr, want) {
			t.Errorf("%v does not say the sentinel refused the credentials (%q):\n%s", tc.args, want, r.stderr)
		}
	}
}

// lookup reads format 1 records (the HASH of releases before format 2) as
// it reads format 2 ones, with their creation time.
func TestLookupFormat1(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		old := newRecords(t, b, redisrepo.Format1)
		const op = "payment.charge"
		before := time.Now().Add(-time.Second).UTC()
		old.completed(op, "order-17", fp, []byte(`{"id":"ch_old"}`))
		old.pending(op, "order-18")

		r := idemctl(t, b.env, "", false, "lookup", "-result", op, "order-17", "order-18")
		if r.code != exitOK {
			t.Fatalf("lookup: exit %d\n%s", r.code, r.output())
		}
		for _, re := range []string{
			`payment\.charge order-17\n  redis key    .*:order-17\n  state        completed\n  ttl          59m5\d(\.\d+)?s\n  created      20\d\d-\d\d-\d\dT[0-9:.]+Z\n  fingerprint  ` + fp + `\n  owner token  present\n  result size  15 bytes\n  result       text: \{"id":"ch_old"\}\n`,
			`payment\.charge order-18\n  redis key    .*:order-18\n  state        pending\n  ttl          [0-9.]+s\n  created      20\d\d-\d\d-\d\dT[0-9:.]+Z\n  fingerprint  none\n  owner token  present\n`,
		} {
			if !regexp.MustCompile(re).MatchString(r.stdout) {
				t.Errorf("lookup's output does not match %s:\n%s", re, r.stdout)
			}
		}

		r = idemctl(t, b.env, "", false, "lookup", "-json", op, "order-17")
		var got []lookupEntry
		if err := json.Unmarshal([]byte(r.stdout), &got); err != nil || len(got) != 1 {
			t.Fatalf("lookup -json: %v\n%s", err, r.output())
		}
		if c := got[0].CreatedAt; c == nil || c.Before(before) || c.After(time.Now().Add(time.Second)) || got[0].State != "completed" {
			t.Errorf("lookup -json of a format 1 record: %+v, want completed, created_at about now", got[0])
		}
	})
}
