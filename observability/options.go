package observability

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
)

// DefaultOperationLimit is the default bound on the distinct operation label
// values an Observer creates; see WithOperationLimit.
const DefaultOperationLimit = 50

// OtherOperation is the operation label value under which an Observer counts
// the events of operations beyond its operation limit (see
// WithOperationLimit), and of events whose operation is not a valid operation
// name. "~" cannot appear in an operation name, so it never collides with a
// real operation.
const OtherOperation = "~other"

// An Option configures an Observer; pass them to New. A nil Option is
// skipped; an invalid value makes New return an error, each refused option
// as a *coordinator.OptionError.
type Option interface{ apply(*config) }

type optionFunc func(*config)

func (f optionFunc) apply(c *config) { f(c) }

type config struct {
	registerer     prometheus.Registerer
	namespace      string
	logger         *zap.Logger
	logKeys        LogKeysMode
	operations     []string
	operationLimit int
}

func defaultConfig() config {
	return config{
		logKeys:        LogKeysHashed,
		operationLimit: DefaultOperationLimit,
	}
}

// WithRegisterer sets the registerer the metrics are registered with. Default
// none, and nil also means none: without a registerer the Observer records no
// metrics. The global prometheus.DefaultRegisterer is never used unless it is
// passed here.
func WithRegisterer(reg prometheus.Registerer) Option {
	return optionFunc(func(c *config) { c.registerer = reg })
}

// WithNamespace prefixes every metric name with namespace and an underscore:
// with "shop", idempotency_requests_total becomes
// shop_idempotency_requests_total. Default "" (no prefix). New refuses a
// namespace that is not [a-zA-Z_][a-zA-Z0-9_]*.
func WithNamespace(namespace string) Option {
	return optionFunc(func(c *config) { c.namespace = namespace })
}

// WithLogger sets the logger the events are written to; the Observer names it
// "idempotency". Default, and nil: zap.NewNop(), which logs nothing.
func WithLogger(logger *zap.Logger) Option {
	return optionFunc(func(c *config) { c.logger = logger })
}

// WithLogKeys sets how log lines show the idempotency key. With LogKeysHashed
// and LogKeysOmitted the key is also replaced in the "error" field, where error
// messages name it: by "<key HASH>" or "<key>". Default LogKeysHashed; "" also
// means LogKeysHashed; New refuses any other value.
func WithLogKeys(mode LogKeysMode) Option {
	return optionFunc(func(c *config) { c.logKeys = mode })
}

// WithOperations names the operations known up front, e.g. those with a TTL
// in IDEMPOTENCY_OPERATION_TTLS. New creates their metric series at zero, so
// the first event of each is visible to rate() and increase(); other
// operations get their series on their first event. Operations named here are
// always kept, even beyond the operation limit. Repeated calls add up; New
// refuses an invalid operation name (see coordinator.ValidateOperation).
func WithOperations(operations ...string) Option {
	ops := append([]string(nil), operations...)
	return optionFunc(func(c *config) { c.operations = append(c.operations, ops...) })
}

// WithOperationLimit bounds the distinct operation label values the Observer
// creates at n, counting those of WithOperations. The events of any further
// operation are counted under OtherOperation, and the first such event is
// logged at Warn. It protects the metrics from an operation name that is
// built from request data by mistake. Default DefaultOperationLimit (50); New
// refuses n < 1.
func WithOperationLimit(n int) Option {
	return optionFunc(func(c *config) { c.operationLimit = n })
}

// LogKeysMode says how log lines show the idempotency key. The zero value
// means LogKeysHashed.
type LogKeysMode string

// The modes of WithLogKeys (IDEMPOTENCY_LOG_KEYS in the fx module).
const (
	// LogKeysHashed logs field "key_hash": the first 16 hex digits (64 bits) of
	// the SHA-256 of the key, enough to correlate the lines of one key and to
	// match a known key, without writing the key itself. The default.
	LogKeysHashed LogKeysMode = "hashed"
	// LogKeysPlain logs field "key": the key as given.
	LogKeysPlain LogKeysMode = "plain"
	// LogKeysOmitted logs no key at all.
	LogKeysOmitted LogKeysMode = "omitted"
)

// parse returns the mode m names, with "" meaning LogKeysHashed.
func (m LogKeysMode) parse() (LogKeysMode, error) {
	switch m {
	case "", LogKeysHashed:
		return LogKeysHashed, nil
	case LogKeysPlain, LogKeysOmitted:
		return m, nil
	}
	return "", fmt.Errorf("unknown key logging mode %q: accepted values are hashed, plain, omitted", string(m))
}

// String returns the mode's name; the zero value prints as "hashed".
func (m LogKeysMode) String() string {
	if m == "" {
		return string(LogKeysHashed)
	}
	return string(m)
}

// UnmarshalText parses "hashed", "plain" or "omitted"; empty text means
// "hashed". It returns an error naming the accepted values for anything else.
func (m *LogKeysMode) UnmarshalText(b []byte) error {
	v, err := LogKeysMode(b).parse()
	if err != nil {
		return err
	}
	*m = v
	return nil
}

// MarshalText returns the mode's name.
func (m LogKeysMode) MarshalText() ([]byte, error) { return []byte(m.String()), nil }
