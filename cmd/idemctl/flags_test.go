package main

import (
	"bytes"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/idemkit/idempotency/redisrepo"
)

// forget -all with stdin from /dev/null (a character device, not a
// terminal) refuses without -yes, with exit status 2, as docs/cli.md says,
// instead of prompting and reading nothing.
func TestForgetAllFromDevNull(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		recs := newRecords(t, b, redisrepo.Format2)
		recs.completed("order.create", "k1", "", []byte("r"))
		null, err := os.Open(os.DevNull)
		if err != nil {
			t.Fatal(err)
		}
		defer null.Close()
		setEnv(t, b.env)
		var stdout, stderr bytes.Buffer
		code := run(t.Context(), []string{"forget", "-operation", "order.create", "-all"}, null, &stdout, &stderr)
		if code != exitUsage || !strings.Contains(stderr.String(), "stdin is not a terminal") || strings.Contains(stderr.String(), "Type the operation name") {
			t.Errorf("forget -all </dev/null: exit %d, want %d and a refusal without a prompt:\n%s%s", code, exitUsage, stdout.String(), stderr.String())
		}
		if n := count(t, b, "order.create"); n != 1 {
			t.Errorf("%d records left, want 1", n)
		}
	})
}

func TestLeadingFlags(t *testing.T) {
	for _, tc := range []struct {
		args        []string
		flags, rest []string
		err         bool
	}{
		{[]string{"lookup", "op", "k"}, nil, []string{"lookup", "op", "k"}, false},
		{[]string{"-redis-url", "redis://h:1/0", "lookup", "op"}, []string{"-redis-url", "redis://h:1/0"}, []string{"lookup", "op"}, false},
		{[]string{"--key-prefix=p:", "-cluster-addrs", "", "count"}, []string{"--key-prefix=p:", "-cluster-addrs", ""}, []string{"count"}, false},
		{[]string{"-h"}, nil, []string{"-h"}, false},
		{[]string{"-json", "lookup"}, nil, nil, true},
		{[]string{"-redis-url"}, nil, nil, true},
	} {
		flags, rest, err := leadingFlags(tc.args)
		if (err != nil) != tc.err || !slices.Equal(flags, tc.flags) || !slices.Equal(rest, tc.rest) {
			t.Errorf("leadingFlags(%q) = %q, %q, %v; want %q, %q, error %v", tc.args, flags, rest, err, tc.flags, tc.rest, tc.err)
		}
	}
}

// The overriding flags work before the command as after it.
func TestFlagsBeforeTheCommand(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		recs := newRecords(t, b, redisrepo.Format2)
		recs.completed("payment.charge", "order-42", "", []byte("r"))
		env := with(b.env, "IDEMPOTENCY_KEY_PREFIX", "elsewhere:")
		r := idemctl(t, env, "", false, "-key-prefix", b.prefix, "lookup", "payment.charge", "order-42")
		if r.code != exitOK || !strings.Contains(r.stdout, "state        completed") {
			t.Errorf("idemctl -key-prefix P lookup: exit %d\n%s", r.code, r.output())
		}
		r = idemctl(t, env, "", false, "-key-prefix="+b.prefix, "count", "payment.charge")
		if r.code != exitOK || !strings.Contains(r.stdout, "payment.charge") {
			t.Errorf("idemctl -key-prefix=P count: exit %d\n%s", r.code, r.output())
		}
		for _, args := range [][]string{{"-json", "lookup", "op", "k"}, {"-key-prefix", "p:"}, {"-redis-url"}} {
			if r := idemctl(t, env, "", false, args...); r.code != exitUsage || !strings.Contains(r.stderr, "Usage:") {
				t.Errorf("%q: exit %d, want %d with the usage:\n%s", args, r.code, exitUsage, r.output())
			}
		}
	})
}
