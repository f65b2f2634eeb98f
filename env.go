package idempotency

import (
	"errors"
	"fmt"
	"os"
	"reflect"
	"slices"
	"strconv"
	"strings"

	"github.com/kelseyhightower/envconfig"
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
			known = variables()
		}
		if slices.Contains(known, name) {
			continue
		}
		errs = append(errs, fmt.Errorf("%s: unknown variable; did you mean %s? (every variable: https://github.com/idemkit/idempotency/blob/main/docs/configuration.md)", name, closest(name, known)))
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
