package idempotency

import (
	"errors"
	"fmt"
	"maps"
	"os"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/kelseyhightower/envconfig"

	"github.com/idemkit/idempotency/coordinator"
	"github.com/idemkit/idempotency/internal/redisurl"
	"github.com/idemkit/idempotency/internal/wholenum"
	"github.com/idemkit/idempotency/observability"
	"github.com/idemkit/idempotency/redisrepo"
)

// LoadSettings reads Settings from the IDEMPOTENCY_* environment variables
// with envconfig (an unset variable takes its default) and validates them.
//
// The error names every variable that is wrong, with what is wrong, one per
// line. A variable that starts with IDEMPOTENCY_ but is none of those it
// reads is an error too, naming the closest known one, so that a misspelt
// setting cannot leave its default in force unnoticed; IDEMPOTENCY_TEST_*
// variables are left to tests. When a value cannot be parsed at all or a
// variable is unknown, the error lists those problems only; Validate's checks
// run once every value parses.
func LoadSettings() (Settings, error) {
	s, err := loadEnv()
	if err != nil {
		return Settings{}, err
	}
	if err := s.Validate(); err != nil {
		return Settings{}, err
	}
	return s, nil
}

// loadEnv runs envconfig on one field at a time, so that one bad variable
// does not hide the next: envconfig.Process stops at the first error. Each
// field is processed in a one-field struct with the same name, type and tags,
// so envconfig derives exactly the variable name it would for Settings.
func loadEnv() (Settings, error) {
	var s Settings
	v := reflect.ValueOf(&s).Elem()
	t := v.Type()
	var errs []error
	for i := range t.NumField() {
		f := t.Field(i)
		if err := notDecimal(f); err != nil {
			errs = append(errs, err)
			continue
		}
		one := reflect.New(reflect.StructOf([]reflect.StructField{{Name: f.Name, Type: f.Type, Tag: f.Tag}}))
		if err := envconfig.Process(EnvPrefix, one.Interface()); err != nil {
			errs = append(errs, envError(err))
			continue
		}
		v.Field(i).Set(one.Elem().Field(0))
	}
	errs = append(errs, unknownVariables(os.Environ())...)
	if len(errs) > 0 {
		return Settings{}, invalidSettings(errs)
	}
	s.RedisClusterAddrs = splitList(s.RedisClusterAddrs)
	s.RedisSentinelAddrs = splitList(s.RedisSentinelAddrs)
	s.FencedOperations = splitList(s.FencedOperations)
	s.RedisReplicaAckOperations = splitList(s.RedisReplicaAckOperations)
	if s.RedisURL == "" {
		// Set but empty (an unset Helm value, say) means the default, as it
		// does for the modes.
		s.RedisURL = DefaultSettings().RedisURL
	}
	return s, nil
}

// notDecimal returns an error naming the variable of f, an integer field,
// when it is set to a number that is not written in decimal (010, 0x10,
// 0o10, 0b10, 1_000): envconfig reads integers with strconv.ParseInt's base
// 0, which takes 010 for 8. Values that are no number at all are left to
// envconfig's own error.
func notDecimal(f reflect.StructField) error {
	switch f.Type.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
	default:
		return nil
	}
	name := fieldVariable(f)
	v, ok := os.LookupEnv(name)
	if !ok || wholenum.Decimal(v) {
		return nil
	}
	if _, err := strconv.ParseInt(v, 0, 64); err != nil && !errors.Is(err, strconv.ErrRange) {
		return nil
	}
	return wholenum.Problem(name, v)
}

// testVariablePrefix starts the IDEMPOTENCY_* variables that LoadSettings
// leaves to tests (IDEMPOTENCY_TEST_REQUIRE_REDIS, say): every other
// IDEMPOTENCY_* variable must be one that it reads.
const testVariablePrefix = EnvPrefix + "_TEST_"

// unknownVariables returns an error for each variable in environ ("NAME=value"
// entries) that starts with IDEMPOTENCY_ but is not one that LoadSettings
// reads, naming the closest known one: a misspelt IDEMPOTENCY_ON_STORAGE_ERRORS
// must not quietly leave the default in force.
func unknownVariables(environ []string) []error {
	var known []string
	var errs []error
	for _, kv := range environ {
		name, _, _ := strings.Cut(kv, "=")
		if !strings.HasPrefix(name, EnvPrefix+"_") || strings.HasPrefix(name, testVariablePrefix) {
			continue
		}
		if known == nil {
			known = append(variables(), declaredVariables()...)
		}
		if slices.Contains(known, name) {
			continue
		}
		errs = append(errs, fmt.Errorf("%s: unknown variable: no package of this program reads it; did you mean %s? (every variable: https://github.com/idemkit/idempotency/blob/main/docs/configuration.md)", name, closest(name, known)))
	}
	slices.SortFunc(errs, func(a, b error) int { return strings.Compare(a.Error(), b.Error()) })
	return errs
}

// variables returns the names of the environment variables LoadSettings
// reads, in the order of the Settings fields: IDEMPOTENCY_ENABLED,
// IDEMPOTENCY_REDIS_URL, ... envconfig derives them, and its usage template
// prints them (a test checks that every field is there).
func variables() []string {
	var b strings.Builder
	_ = envconfig.Usagef(EnvPrefix, &Settings{}, &b, "{{range .}}{{usage_key .}}\n{{end}}")
	return strings.Fields(b.String())
}

// closest returns the name in names most likely meant by name: the DEFAULT_
// variant of it when there is one (IDEMPOTENCY_TTL means
// IDEMPOTENCY_DEFAULT_TTL more likely than the MIN_TTL it is as close to),
// else the name with the least edit distance.
func closest(name string, names []string) string {
	if d := EnvPrefix + "_DEFAULT_" + strings.TrimPrefix(name, EnvPrefix+"_"); slices.Contains(names, d) {
		return d
	}
	best, bestDist := "", -1
	for _, n := range names {
		if d := editDistance(name, n); bestDist < 0 || d < bestDist {
			best, bestDist = n, d
		}
	}
	return best
}

// editDistance is the Levenshtein distance between a and b, in bytes.
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

// envError rewrites an envconfig error as "VARIABLE: what is wrong".
func envError(err error) error {
	var pe *envconfig.ParseError
	if !errors.As(err, &pe) {
		return err
	}
	switch pe.TypeName {
	case "time.Duration":
		return fmt.Errorf("%s: %q is not a duration; use a Go duration such as 500ms, 30s or 1h30m", pe.KeyName, pe.Value)
	case "bool":
		return fmt.Errorf("%s: %q is not a boolean; use true or false", pe.KeyName, pe.Value)
	case "int":
		if errors.Is(pe.Err, strconv.ErrRange) {
			return fmt.Errorf("%s: %q is out of range", pe.KeyName, pe.Value)
		}
		return fmt.Errorf("%s: %q is not an integer", pe.KeyName, pe.Value)
	}
	// The modes and OperationTTLs say what is wrong themselves.
	return fmt.Errorf("%s: %s", pe.KeyName, pe.Err)
}

// SettingsError is the error of invalid settings: each refused variable, one
// per line, after "idempotency: invalid settings:". Under fx it arrives
// wrapped in fx's own errors; errors.As finds it, so that a main can report
// it alone (examples/fxapp does).
type SettingsError struct {
	// Errs are the refusals, each naming its variable.
	Errs []error
}

// Error returns the message: the heading, then one refusal per line.
func (e *SettingsError) Error() string {
	return "idempotency: invalid settings:\n" + errors.Join(e.Errs...).Error()
}

// Unwrap returns the refusals, for errors.Is and errors.As.
func (e *SettingsError) Unwrap() []error { return e.Errs }

func invalidSettings(errs []error) error { return &SettingsError{Errs: errs} }

// splitList trims spaces around entries and drops empty ones, so that
// "a:1, b:2," is two entries.
func splitList(list []string) []string {
	var out []string
	for _, e := range list {
		if e = strings.TrimSpace(e); e != "" {
			out = append(out, e)
		}
	}
	return out
}

// Validate reports every problem in s at once, one per line, each naming its
// environment variable: "IDEMPOTENCY_LEASE: must be at least 1ms, got 0s".
// It returns nil when s is usable. Every check applies whether or not
// Enabled is set, so that turning the kill switch off and on again cannot
// fail.
//
// The rules are those of the packages that use the values:
// coordinator.New for the coordinator's options, observability.New for the
// metrics and logs, and the Redis client for the URL and the cluster seeds;
// Validate only names the variable behind each refused value.
func (s Settings) Validate() error {
	var errs []error
	bad := func(name string, err error) {
		errs = append(errs, fmt.Errorf("%s_%s: %w", EnvPrefix, name, err))
	}
	if err := redisurl.Validate(s.RedisURL, s.topology()); err != nil {
		bad("REDIS_URL", err)
	}
	for _, addr := range s.RedisClusterAddrs {
		if err := redisurl.ValidateHostPort(addr); err != nil {
			bad("REDIS_CLUSTER_ADDRS", fmt.Errorf("entry %q: %w", addr, err))
		}
	}
	errs = append(errs, s.sentinelErrors()...)
	if _, err := s.RedisLogs.parse(); err != nil {
		bad("REDIS_LOGS", err)
	}
	if s.BreakerFailures < 0 {
		bad("BREAKER_FAILURES", fmt.Errorf("must be 0 (no breaker) or more, got %d", s.BreakerFailures))
	}
	if s.BreakerFailures > 0 && s.BreakerCooldown <= 0 {
		bad("BREAKER_COOLDOWN", fmt.Errorf("must be positive (a duration such as 1s or 250ms) while IDEMPOTENCY_BREAKER_FAILURES is not 0, got %v", s.BreakerCooldown))
	}
	if s.RecordFormat != int(redisrepo.Format1) && s.RecordFormat != int(redisrepo.Format2) {
		bad("RECORD_FORMAT", fmt.Errorf("must be 1 or 2, got %d", s.RecordFormat))
	}
	if len(s.FencedOperations) > 0 && s.RecordFormat == int(redisrepo.Format1) {
		bad("FENCED_OPERATIONS", fmt.Errorf("fences need IDEMPOTENCY_RECORD_FORMAT=2, and it is 1 (format 1 records have none): leave IDEMPOTENCY_FENCED_OPERATIONS empty until the rollout to format 2 is over"))
	}
	acking := s.RedisReplicaAcks > 0 || s.RedisReplicaAckFsync
	if s.RedisCoalesceLanes < 0 {
		bad("REDIS_COALESCE_LANES", fmt.Errorf("must be 0 (off) or more, got %d", s.RedisCoalesceLanes))
	}
	switch {
	case s.RedisReplicaAcks < 0:
		bad("REDIS_REPLICA_ACKS", fmt.Errorf("must be 0 (off) or more, got %d", s.RedisReplicaAcks))
	case acking && s.RedisAutoPipeline:
		bad("REDIS_REPLICA_ACKS", errors.New("cannot be combined with IDEMPOTENCY_REDIS_AUTO_PIPELINE=true: the touch of an acknowledged write and its WAIT must share one connection, which the AutoPipeliner does not keep"))
	case acking && s.RecordFormat == int(redisrepo.Format1):
		bad("REDIS_REPLICA_ACKS", errors.New("needs IDEMPOTENCY_RECORD_FORMAT=2, and it is 1: a format 1 completion cannot be sent again safely"))
	case !acking && len(s.RedisReplicaAckOperations) > 0:
		bad("REDIS_REPLICA_ACK_OPERATIONS", errors.New("acknowledges nothing without IDEMPOTENCY_REDIS_REPLICA_ACKS (or IDEMPOTENCY_REDIS_REPLICA_ACK_FSYNC)"))
	}
	for _, op := range s.RedisReplicaAckOperations {
		if err := coordinator.ValidateOperation(op); err != nil {
			bad("REDIS_REPLICA_ACK_OPERATIONS", errors.New(strings.TrimPrefix(err.Error(), coordinator.ErrInvalidRequest.Error()+": ")))
		}
	}
	for _, e := range optionErrors(coordinator.ValidateOptions(s.CoordinatorOptions()...)) {
		bad(optionVariable(e), optionReason(e))
	}
	for _, e := range optionErrors(observability.ValidateOptions(s.observerOptions()...)) {
		if oe := (*coordinator.OptionError)(nil); errors.As(e, &oe) && oe.Option == "WithOperations" {
			// Its operations are the keys of OperationTTLS, which the
			// coordinator has just checked by the same rule
			// (coordinator.ValidateOperation) under the same variable. Its
			// message does not always name the operation ("operation is
			// empty"): report the problem once.
			continue
		}
		bad(optionVariable(e), optionReason(e))
	}
	if len(errs) > 0 {
		return invalidSettings(errs)
	}
	return nil
}

// sentinelErrors returns what is wrong with the REDIS_SENTINEL_* variables,
// each error naming its variable.
func (s Settings) sentinelErrors() []error {
	var errs []error
	bad := func(name string, err error) {
		errs = append(errs, fmt.Errorf("%s_%s: %w", EnvPrefix, name, err))
	}
	for _, addr := range s.RedisSentinelAddrs {
		if err := redisurl.ValidateHostPort(addr); err != nil {
			bad("REDIS_SENTINEL_ADDRS", fmt.Errorf("entry %q: %w", addr, err))
		}
	}
	switch sentinel := s.RedisSentinelMaster != ""; {
	case sentinel && len(s.RedisClusterAddrs) > 0:
		bad("REDIS_SENTINEL_MASTER", fmt.Errorf("cannot be combined with %s_REDIS_CLUSTER_ADDRS: set one of them (a cluster fails over by itself)", EnvPrefix))
	case sentinel && len(s.RedisSentinelAddrs) == 0:
		bad("REDIS_SENTINEL_ADDRS", fmt.Errorf("is empty but %s_REDIS_SENTINEL_MASTER is set: list the sentinels, host:port,host:port", EnvPrefix))
	case !sentinel && len(s.RedisSentinelAddrs) > 0:
		bad("REDIS_SENTINEL_MASTER", fmt.Errorf("is empty but %s_REDIS_SENTINEL_ADDRS is set: name the master the sentinels monitor", EnvPrefix))
	case !sentinel && s.RedisSentinelPassword != "":
		bad("REDIS_SENTINEL_PASSWORD", fmt.Errorf("is set but %s_REDIS_SENTINEL_MASTER is not: it is the sentinels' password", EnvPrefix))
	}
	return errs
}

// optionTag is the struct tag of a Settings field that names the options
// (comma-separated) of coordinator or observability that carry its value:
// Validate reports their errors under the field's variable. A new option
// with a variable needs only its field, with this tag, and its line in
// CoordinatorOptions or observerOptions.
const optionTag = "option"

// optionVariables names the variable (without the prefix) behind each option
// that Settings sets, by the option's name as a *coordinator.OptionError from
// coordinator.New or observability.New reports it; it is read from the fields'
// option tags.
var optionVariables = func() map[string]string {
	m := map[string]string{}
	t := reflect.TypeFor[Settings]()
	for i := range t.NumField() {
		f := t.Field(i)
		tag, ok := f.Tag.Lookup(optionTag)
		if !ok {
			continue
		}
		v := strings.TrimPrefix(fieldVariable(f), EnvPrefix+"_")
		for opt := range strings.SplitSeq(tag, ",") {
			m[opt] = v
		}
	}
	return m
}()

// fieldVariable returns the variable of a Settings field, as envconfig
// derives it (IDEMPOTENCY_LEASE for Lease).
func fieldVariable(f reflect.StructField) string {
	one := reflect.New(reflect.StructOf([]reflect.StructField{{Name: f.Name, Type: f.Type, Tag: f.Tag}}))
	var b strings.Builder
	_ = envconfig.Usagef(EnvPrefix, one.Interface(), &b, "{{range .}}{{usage_key .}}{{end}}")
	return b.String()
}

// optionNames replaces the option names in an option's error message with
// the names of their variables.
var optionNames = func() *strings.Replacer {
	var pairs []string
	for _, opt := range slices.Sorted(maps.Keys(optionVariables)) {
		pairs = append(pairs, opt, EnvPrefix+"_"+optionVariables[opt])
	}
	return strings.NewReplacer(pairs...)
}()

// optionVariable returns the variable name (without the prefix) behind the
// option that e, a *coordinator.OptionError, names.
func optionVariable(e error) string {
	var oe *coordinator.OptionError
	var name string
	if errors.As(e, &oe) {
		name = oe.Option
	}
	if v, ok := optionVariables[name]; ok {
		return v
	}
	return "(option " + name + ")" // a new option without a variable: a bug the tests catch
}

// optionReason returns what e says is wrong, with the options it names
// replaced by their variables.
func optionReason(e error) error {
	msg := e.Error()
	if oe := (*coordinator.OptionError)(nil); errors.As(e, &oe) {
		msg = oe.Err.Error()
	}
	return errors.New(optionNames.Replace(msg))
}

// optionErrors returns the *OptionErrors in the tree of err, in order.
func optionErrors(err error) []error {
	var out []error
	var walk func(error)
	walk = func(err error) {
		switch e := err.(type) {
		case nil:
		case *coordinator.OptionError:
			out = append(out, e)
		case interface{ Unwrap() []error }:
			for _, e := range e.Unwrap() {
				walk(e)
			}
		case interface{ Unwrap() error }:
			walk(e.Unwrap())
		default:
			out = append(out, err) // not an option's: passed on as it is
		}
	}
	walk(err)
	return out
}

// declared holds the IDEMPOTENCY_* variables that other modules read, each
// with the module that reads it (DeclareVariables).
var declared struct {
	sync.Mutex
	owners map[string]string
}

// DeclareVariables declares IDEMPOTENCY_* variables that a module of its
// own reads from the environment (idempg its IDEMPOTENCY_POSTGRES_*), read
// by owner ("idempg.Module"), so that LoadSettings accepts them instead of
// refusing them as misspelt, and so that Module, when its settings come
// from the environment, refuses to start with one of them set while the
// app's store is its own Redis one: the app forgot owner. A module calls it
// from an init function, so that importing the module is enough. A name
// without the IDEMPOTENCY_ prefix panics, as a programming error.
func DeclareVariables(owner string, names ...string) {
	declared.Lock()
	defer declared.Unlock()
	if declared.owners == nil {
		declared.owners = map[string]string{}
	}
	for _, n := range names {
		if !strings.HasPrefix(n, EnvPrefix+"_") || strings.HasPrefix(n, testVariablePrefix) {
			panic("idempotency: DeclareVariables(" + owner + "): " + n + " is not an " + EnvPrefix + "_* variable of a setting")
		}
		declared.owners[n] = owner
	}
}

// declaredVariables returns the names DeclareVariables declared, sorted.
func declaredVariables() []string {
	declared.Lock()
	defer declared.Unlock()
	return slices.Sorted(maps.Keys(declared.owners))
}

// unreadDeclared returns an error for the first declared variable, in name
// order, that is set in the environment: with the app's store its own, no
// module of the app reads it.
func unreadDeclared() error {
	declared.Lock()
	defer declared.Unlock()
	for _, n := range slices.Sorted(maps.Keys(declared.owners)) {
		if v, ok := os.LookupEnv(n); ok && v != "" {
			return fmt.Errorf("%s is set, but the app has no %s, which reads it: add it to the app, or unset the variable", n, declared.owners[n])
		}
	}
	return nil
}
