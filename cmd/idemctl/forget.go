package main

import (
	"bufio"
	"context"
	"fmt"
	"strconv"
	"strings"
)

// forgetWarning is said before every forget -all and after every forget.
const forgetWarning = "A forgotten key lets the next call with it run its action AGAIN (a retried payment is charged twice);\n" +
	"forgetting a pending key lets a second caller run while the first still runs."

// forget deletes the records of keys (given, or read from -file), or, with
// -all, of every key of an operation (on Redis found with SCAN, on
// PostgreSQL deleted a batch at a time), after a confirmation. A long one
// reports its progress on stderr.
func (a *app) forget(ctx context.Context, args []string) int {
	fs, o := a.newFlagSet("forget", "forget [flags] <operation> <key>...\n       idemctl forget [flags] -operation <op> -file <keys.txt | ->\n       idemctl forget [flags] -operation <op> -all [-yes]")
	all := fs.Bool("all", false, "forget every record of the operation (-operation): on Redis found with SCAN, on PostgreSQL deleted 1000 at a time")
	operation := fs.String("operation", "", "the `operation` (instead of the first argument)")
	yes := fs.Bool("yes", false, "with -all: do not ask for a confirmation (required when stdin is not a terminal)")
	file := fs.String("file", "", "read the keys from `file`, one per line (- is stdin), and forget them 1000 at a time, reporting the progress")
	scope := addScopeFlag(fs)
	rest, err := parse(fs, o, args)
	if err != nil {
		return parseStatus(err)
	}
	if *operation == "" && len(rest) > 0 && !*all {
		*operation, rest = rest[0], rest[1:]
	}
	switch {
	case *all && *operation == "":
		return a.usageError(fs, "-all needs -operation")
	case *all && len(rest) > 0:
		return a.usageError(fs, "-all takes no keys, got %q", rest)
	case *all && *file != "":
		return a.usageError(fs, "-all and -file do not go together")
	case !*all && (*operation == "" || len(rest) == 0 && *file == ""):
		return a.usageError(fs, "want an operation and at least one key (or -file), or -operation and -all")
	case *yes && !*all:
		return a.usageError(fs, "-yes goes with -all only")
	case scope.set && *all:
		return a.usageError(fs, "-scope goes with keys, not with -all (which forgets the records of every scope)")
	}
	keys, err := parseKeys(*operation, rest, scope)
	if err != nil {
		return a.usageError(fs, "%v", err)
	}
	if *file != "" {
		more, err := a.readKeys(*file, *operation, scope)
		if err != nil {
			return a.usageError(fs, "-file: %v", err)
		}
		keys = append(keys, more...)
	}
	// A key named twice is forgotten once, and counted once: the second
	// Forget of it would find it gone and call it absent.
	keys, dropped := distinctKeys(keys)
	c, err := a.connect(ctx, o)
	if err != nil {
		return a.fail("forget", err)
	}
	defer c.Close()
	if *all {
		return a.forgetAll(ctx, c, *operation, *yes)
	}

	n, err := a.forgetKeys(ctx, c, keys, "keys of "+*operation)
	if err != nil {
		return a.fail("forget", fmt.Errorf("%w (%d forgotten before the error)", err, n))
	}
	in := ""
	if scope.set {
		in = " in scope " + strconv.QuoteToASCII(scope.value)
	}
	dups := ""
	if dropped > 0 {
		dups = ", " + plural(dropped, "duplicate") + " dropped"
	}
	fmt.Fprintf(a.stdout, "forgot %d of %s of %s%s (%d absent%s)\n", n, plural(len(keys), "key"), *operation, in, len(keys)-n, dups)
	fmt.Fprintln(a.stderr, forgetWarning)
	return exitOK
}

// forgetAll forgets every record of operation, after the operator typed the
// operation's name (or with yes).
func (a *app) forgetAll(ctx context.Context, c recordStore, operation string, yes bool) int {
	counts, err := c.count(ctx, []string{operation})
	if err != nil {
		return a.fail("forget", err)
	}
	var n countEntry
	if len(counts) == 1 {
		n = counts[0]
	}
	where := c.where()
	if n.Total == 0 {
		fmt.Fprintf(a.stdout, "no records of %s %s: nothing to forget\n", operation, where)
		return exitOK
	}
	if !yes {
		if !a.terminal {
			fmt.Fprintf(a.stderr, "idemctl forget: refusing to forget %s of %s without -yes: stdin is not a terminal, so nobody can confirm\n", plural(n.Total, "record"), operation)
			return exitUsage
		}
		fmt.Fprintf(a.stderr, "About to forget %s of %s %s (%d pending, %d completed, %d unreadable).\n%s\nType the operation name (%s) to forget them: ",
			plural(n.Total, "record"), operation, where, n.Pending, n.Completed, n.Unreadable, forgetWarning, operation)
		line, _ := bufio.NewReader(a.stdin).ReadString('\n')
		if !strings.HasSuffix(line, "\n") {
			fmt.Fprintln(a.stderr) // end of input: end the prompt's line
		}
		if strings.TrimSpace(line) != operation {
			fmt.Fprintln(a.stderr, "idemctl forget: not confirmed: nothing forgotten")
			return exitFailure
		}
	}
	// The progress counts the records forgotten, not the keys handled: SCAN
	// may return a key twice (and PostgreSQL deletes expired rows too), so
	// those could pass the count; a key deleted is deleted once.
	p := a.newProgress("records of "+operation+" forgotten", n.Total)
	forgotten, err := c.forgetOperation(ctx, operation, func(_, forgotten int) { p.reportForgotten(forgotten) })
	if err != nil {
		return a.fail("forget", fmt.Errorf("%w (%d forgotten before the error)", err, forgotten))
	}
	fmt.Fprintf(a.stdout, "forgot %s of %s %s\n", plural(forgotten, "record"), operation, where)
	if yes {
		fmt.Fprintln(a.stderr, forgetWarning)
	}
	return exitOK
}
