package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/idemkit/idempotency/coordinator/idemstore"
	"github.com/idemkit/idempotency/idempg"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/coordinator"
	"github.com/idemkit/idempotency/idemkey"
)

// Exit statuses.
const (
	exitOK      = 0
	exitFailure = 1 // invalid settings, the store misconfigured, failed or unreachable, not confirmed
	exitUsage   = 2 // unknown command, bad flag or argument
)

const usageText = `idemctl: the operator tool of idemkit's idempotency records, in Redis or in
PostgreSQL (idempg).

Usage:
  idemctl check [flags]                                  print the settings, check Redis (Cluster, Sentinel) or PostgreSQL
  idemctl lookup [flags] <operation> <key>...            describe keys (-scope, -json, -result)
  idemctl forget [flags] <operation> <key>...            forget keys (-scope)
  idemctl forget [flags] -operation <op> -all [-yes]     forget every record of an operation
  idemctl count [flags] [operation...]                   count records per operation and state

It reads the IDEMPOTENCY_* environment variables, as the module does
(https://github.com/idemkit/idempotency/blob/main/docs/configuration.md).
Every command takes -redis-url, -cluster-addrs, -key-prefix and
-postgres-url, which override IDEMPOTENCY_REDIS_URL,
IDEMPOTENCY_REDIS_CLUSTER_ADDRS, IDEMPOTENCY_KEY_PREFIX and
IDEMPOTENCY_POSTGRES_URL, and may come before the command too. With a
PostgreSQL URL, every command works on the table idempotency_records there. Flags may come
before or after the arguments; put -- before a key that starts with '-'. "idemctl <command> -h" lists a
command's flags.

A forgotten key lets the next call with it run its action AGAIN.

Exit status: 0 success, 1 failure (invalid settings, the store refusing
idemctl, unreachable or failing, forget not confirmed), 2 usage error.
`

// app is one run of idemctl: where it reads and writes.
type app struct {
	stdin          io.Reader
	stdout, stderr io.Writer
	// terminal reports whether stdin is a terminal, where an operator can
	// confirm a forget -all.
	terminal bool
	// newClient builds the Redis client of the settings; nil means
	// idempotency.NewRedisClient, as the module builds it. Tests wrap it.
	newClient func(idempotency.Settings) (redis.UniversalClient, error)
	// progressEvery is how often a long forget reports its progress; 0
	// means defaultProgressEvery. Tests shorten it.
	progressEvery time.Duration
}

// client returns the Redis client of s (newClient).
func (a *app) client(s idempotency.Settings) (redis.UniversalClient, error) {
	if a.newClient != nil {
		return a.newClient(s)
	}
	return idempotency.NewRedisClient(s)
}

// run runs idemctl with args (without the program name) and returns its exit
// status. It reads the settings from the process's environment
// (idempotency.LoadSettings), confirmations from stdin, and writes results
// to stdout and errors, warnings and prompts to stderr.
func run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	a := &app{stdin: stdin, stdout: stdout, stderr: stderr, terminal: isTerminal(stdin)}
	return a.run(ctx, args)
}

func (a *app) run(ctx context.Context, args []string) int {
	if len(args) == 0 {
		fmt.Fprint(a.stderr, usageText)
		return exitUsage
	}
	pre, args, err := leadingFlags(args)
	if err != nil {
		fmt.Fprintf(a.stderr, "idemctl: %v\n\n%s", err, usageText)
		return exitUsage
	}
	if len(args) == 0 {
		fmt.Fprintf(a.stderr, "idemctl: no command after %s\n\n%s", strings.Join(pre, " "), usageText)
		return exitUsage
	}
	cmd, args := args[0], append(pre, args[1:]...)
	switch cmd {
	case "check":
		return a.check(ctx, args)
	case "lookup":
		return a.lookup(ctx, args)
	case "forget":
		return a.forget(ctx, args)
	case "count":
		return a.count(ctx, args)
	case "help", "-h", "-help", "--help":
		fmt.Fprint(a.stdout, usageText)
		return exitOK
	}
	fmt.Fprintf(a.stderr, "idemctl: unknown command %q\n\n%s", cmd, usageText)
	return exitUsage
}

// isTerminal reports whether r is a terminal, where an operator can answer
// a prompt: not a pipe, a file or /dev/null (isTerminalFile).
func isTerminal(r io.Reader) bool {
	f, ok := r.(*os.File)
	return ok && isTerminalFile(f)
}

// overridingFlags are the flags of every command that override a variable:
// they may come before the command too.
var overridingFlags = []string{"redis-url", "cluster-addrs", "key-prefix", "postgres-url"}

// leadingFlags splits the overriding flags before the command ("idemctl
// -redis-url X lookup ...") from the rest of args, so that they can be
// handed to the command. Another flag there is an error; -h and its
// spellings are left to the command switch.
func leadingFlags(args []string) (flags, rest []string, err error) {
	for len(args) > 0 && strings.HasPrefix(args[0], "-") {
		switch args[0] {
		case "-h", "-help", "--help":
			return flags, args, nil
		}
		name, _, hasValue := strings.Cut(strings.TrimLeft(args[0], "-"), "=")
		switch {
		case !slices.Contains(overridingFlags, name):
			return nil, nil, fmt.Errorf("flag %s before the command: only -redis-url, -cluster-addrs, -key-prefix and -postgres-url may come before it", args[0])
		case hasValue:
			flags, args = append(flags, args[0]), args[1:]
		case len(args) < 2:
			return nil, nil, fmt.Errorf("flag %s needs a value", args[0])
		default:
			flags, args = append(flags, args[0], args[1]), args[2:]
		}
	}
	return flags, args, nil
}

// overrides are the flags every command has, which override variables.
type overrides struct {
	redisURL, clusterAddrs, keyPrefix, postgresURL string
	set                                            map[string]bool // by flag name: given on the command line
}

// newFlagSet returns the flag set of a command, with the overriding flags.
func (a *app) newFlagSet(name, synopsis string) (*flag.FlagSet, *overrides) {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(a.stderr)
	o := &overrides{}
	fs.StringVar(&o.redisURL, "redis-url", "", "Redis `URL`, overriding IDEMPOTENCY_REDIS_URL (a password here is visible to ps: prefer the variable)")
	fs.StringVar(&o.clusterAddrs, "cluster-addrs", "", "comma-separated Redis Cluster seed `nodes`, overriding IDEMPOTENCY_REDIS_CLUSTER_ADDRS (\"\": a single server)")
	fs.StringVar(&o.keyPrefix, "key-prefix", "", "key `prefix`, overriding IDEMPOTENCY_KEY_PREFIX")
	fs.StringVar(&o.postgresURL, "postgres-url", "", "PostgreSQL `URL` of the PostgreSQL store (idempg), overriding IDEMPOTENCY_POSTGRES_URL: when set, the records are read there instead of in Redis (a password here is visible to ps: prefer the variable)")
	fs.Usage = func() {
		fmt.Fprintf(a.stderr, "Usage: idemctl %s\n\nFlags:\n", synopsis)
		fs.PrintDefaults()
	}
	return fs, o
}

// parse parses args with fs, flags and arguments in any order ("--" ends the
// flags), and returns the arguments. It returns flag.ErrHelp for -h.
func parse(fs *flag.FlagSet, o *overrides, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		rest := fs.Args()
		if n := len(args) - len(rest); n > 0 && args[n-1] == "--" {
			pos = append(pos, rest...)
			break
		}
		if len(rest) == 0 {
			break
		}
		pos = append(pos, rest[0])
		args = rest[1:]
	}
	if o != nil {
		o.set = map[string]bool{}
		fs.Visit(func(f *flag.Flag) { o.set[f.Name] = true })
	}
	return pos, nil
}

// parseStatus returns the exit status for an error of parse: exitOK after
// -h, which printed the usage, else exitUsage (the flag package has printed
// the error and the usage).
func parseStatus(err error) int {
	if errors.Is(err, flag.ErrHelp) {
		return exitOK
	}
	return exitUsage
}

// usageError prints msg and the command's usage and returns exitUsage.
func (a *app) usageError(fs *flag.FlagSet, format string, args ...any) int {
	fmt.Fprintf(a.stderr, "idemctl %s: %s\n", fs.Name(), fmt.Sprintf(format, args...))
	fs.Usage()
	return exitUsage
}

// fail prints err and returns exitFailure.
func (a *app) fail(cmd string, err error) int {
	fmt.Fprintf(a.stderr, "idemctl %s: %v\n", cmd, err)
	return exitFailure
}

// config is what idemctl reads from the environment: the core's settings
// and, for the PostgreSQL store, idempg's.
type config struct {
	idempotency.Settings
	pg idempg.Settings
}

// settings returns the settings from the environment (idempotency's and
// idempg's LoadSettings), with the flags in o applied and validated again.
// Its errors name the variables (IDEMPOTENCY_REDIS_URL for -redis-url) and
// never show a password.
func (o *overrides) settings() (config, error) {
	s, err := idempotency.LoadSettings()
	pg, pgErr := idempg.LoadSettings()
	if err = errors.Join(err, pgErr); err != nil {
		return config{}, err
	}
	c := config{Settings: s, pg: pg}
	if len(o.set) == 0 {
		return c, nil
	}
	if o.set["redis-url"] {
		c.RedisURL = o.redisURL
	}
	if o.set["cluster-addrs"] {
		c.RedisClusterAddrs = splitList(o.clusterAddrs)
	}
	if o.set["key-prefix"] {
		c.KeyPrefix = o.keyPrefix
	}
	if o.set["postgres-url"] {
		c.pg.URL = o.postgresURL
	}
	if err := errors.Join(c.Validate(), c.pg.Validate()); err != nil {
		return c, fmt.Errorf("%w\n(-redis-url, -cluster-addrs, -key-prefix and -postgres-url stand for the variables they override)", err)
	}
	return c, nil
}

// splitList splits a comma-separated list, trimming spaces around entries
// and dropping empty ones, as LoadSettings reads
// IDEMPOTENCY_REDIS_CLUSTER_ADDRS.
func splitList(s string) []string {
	var out []string
	for e := range strings.SplitSeq(s, ",") {
		if e = strings.TrimSpace(e); e != "" {
			out = append(out, e)
		}
	}
	return out
}

// plural returns "1 record", "2 records".
func plural(n int, what string) string {
	if n == 1 {
		return "1 " + what
	}
	return fmt.Sprintf("%d %ss", n, what)
}

// scopeFlag is the -scope flag of lookup and forget.
type scopeFlag struct {
	value string
	set   bool // given, "" included: the empty scope is a scope
}

func (f *scopeFlag) String() string { return f.value }

func (f *scopeFlag) Set(v string) error {
	f.value, f.set = v, true
	return nil
}

// addScopeFlag adds -scope to fs.
func addScopeFlag(fs *flag.FlagSet) *scopeFlag {
	f := &scopeFlag{}
	fs.Var(f, "scope", "the `scope` the middleware or interceptor scoped the keys to (what its WithKeyScope hook returned, e.g. the tenant): the keys are looked up as idemkey.Scoped(scope, key) stores them")
	return f
}

// key returns the key the coordinator sees for the client's key k: k
// itself, or idemkey.Scoped under -scope.
func (f *scopeFlag) key(k string) string {
	if !f.set {
		return k
	}
	return idemkey.Scoped(f.value, k)
}

// parseKeys returns the keys of operation, scoped by scope, or the first
// error of coordinator.ValidateOperation and ValidateKey (of the keys as
// given).
func parseKeys(operation string, keys []string, scope *scopeFlag) ([]idemstore.Key, error) {
	if err := coordinator.ValidateOperation(operation); err != nil {
		return nil, err
	}
	out := make([]idemstore.Key, len(keys))
	for i, k := range keys {
		if err := coordinator.ValidateKey(k); err != nil {
			return nil, fmt.Errorf("key %d (%s): %w", i+1, strconv.QuoteToASCII(k), err)
		}
		out[i] = idemstore.Key{Operation: operation, Key: scope.key(k)}
	}
	return out, nil
}

// safe returns s as it is when it is printable ASCII, else quoted with Go
// escapes: what is read from Redis never writes control characters to a
// terminal.
func safe(s string) string {
	for i := 0; i < len(s); i++ {
		if s[i] < 0x20 || s[i] > 0x7e {
			return strconv.QuoteToASCII(s)
		}
	}
	return s
}

// printable reports whether s is UTF-8 of printable characters and spaces
// only: no control characters, no newlines.
func printable(s string) bool {
	if !utf8.ValidString(s) {
		return false
	}
	for _, r := range s {
		if !unicode.IsPrint(r) {
			return false
		}
	}
	return true
}
