package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/idemkit/idempotency/coordinator/idemstore"

	"github.com/idemkit/idempotency/coordinator"
)

// defaultProgressEvery is how often a long forget reports its progress.
const defaultProgressEvery = time.Second

// progress reports how far a long forget has come, on stderr, a line at a
// time and at most once per interval, so that an operator sees a scan of
// millions of keys move (and a log keeps the lines).
type progress struct {
	w       io.Writer
	what    string // "keys of order.create from keys.txt"
	total   int    // the number expected, or 0 when unknown
	every   time.Duration
	last    time.Time
	printed bool
}

func (a *app) newProgress(what string, total int) *progress {
	every := a.progressEvery
	if every == 0 {
		every = defaultProgressEvery
	}
	return &progress{w: a.stderr, what: what, total: total, every: every, last: time.Now()}
}

// report says that done keys were handled and forgotten of them were
// deleted, when an interval has passed since the last line.
func (p *progress) report(done, forgotten int) {
	if time.Since(p.last) < p.every {
		return
	}
	p.last = time.Now()
	p.printed = true
	fmt.Fprintf(p.w, "idemctl forget: %s so far, %d forgotten\n", p.howFar(done), forgotten)
}

// reportForgotten says that forgotten records were deleted, when an
// interval has passed since the last line: the progress of forget -all,
// whose what says "forgotten".
func (p *progress) reportForgotten(forgotten int) {
	if time.Since(p.last) < p.every {
		return
	}
	p.last = time.Now()
	p.printed = true
	fmt.Fprintf(p.w, "idemctl forget: %s so far\n", p.howFar(forgotten))
}

// howFar returns "done of total (n%) what", or "done what" without a total.
func (p *progress) howFar(done int) string {
	if p.total > 0 {
		return fmt.Sprintf("%d of %d (%d%%) %s", done, p.total, min(100, 100*done/p.total), p.what)
	}
	return fmt.Sprintf("%d %s", done, p.what)
}

// fileBatch is how many keys of a -file forget goes to the store at once.
const fileBatch = 1000

// readKeys reads the keys of operation in name ("-" is stdin), one per
// line; blank lines are skipped, and a line's surrounding spaces and its
// "\r" are not part of the key. It returns an error naming the first line
// whose key is invalid, or saying that name holds no key, before anything
// is forgotten.
func (a *app) readKeys(name, operation string, scope *scopeFlag) ([]idemstore.Key, error) {
	var r io.Reader = a.stdin
	if name != "-" {
		f, err := os.Open(name)
		if err != nil {
			return nil, err
		}
		defer f.Close()
		r = f
	}
	var keys []string
	sc := bufio.NewScanner(r)
	for line := 1; sc.Scan(); line++ {
		k := strings.TrimSpace(sc.Text())
		if k == "" {
			continue
		}
		if err := coordinator.ValidateKey(k); err != nil {
			return nil, fmt.Errorf("%s, line %d (%s): %w", name, line, strconv.QuoteToASCII(k), err)
		}
		keys = append(keys, k)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	if len(keys) == 0 {
		// An empty list is a mistake (a script that wrote nothing), not a
		// request to forget nothing.
		if name == "-" {
			name = "- (stdin)"
		}
		return nil, fmt.Errorf("no keys in %s", name)
	}
	return parseKeys(operation, keys, scope)
}

// distinctKeys returns keys without their repetitions, in the order of
// their first appearance, and how many repetitions it dropped.
func distinctKeys(keys []idemstore.Key) ([]idemstore.Key, int) {
	seen := make(map[idemstore.Key]bool, len(keys))
	out := keys[:0:0]
	for _, k := range keys {
		if !seen[k] {
			seen[k] = true
			out = append(out, k)
		}
	}
	return out, len(keys) - len(out)
}

// forgetKeys forgets keys fileBatch at a time, reporting its progress, and
// returns how many it forgot, before an error too.
func (a *app) forgetKeys(ctx context.Context, c recordStore, keys []idemstore.Key, what string) (int, error) {
	p := a.newProgress(what, len(keys))
	forgotten := 0
	for start := 0; start < len(keys); start += fileBatch {
		n, err := c.forget(ctx, keys[start:min(start+fileBatch, len(keys))])
		forgotten += n
		if err != nil {
			return forgotten, err
		}
		p.report(min(start+fileBatch, len(keys)), forgotten)
	}
	return forgotten, nil
}
