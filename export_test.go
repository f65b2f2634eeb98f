package idempotency

import (
	"time"

	"github.com/idemkit/idempotency/observability"
)

// Internals for the tests of package idempotency_test.
var (
	// OptionVariables is optionVariables: option name to variable name,
	// without the prefix, read from the Settings fields' option tags.
	OptionVariables = optionVariables
	// Variables is variables: the names of the variables LoadSettings reads.
	Variables = variables
	// LoadEnv is loadEnv: LoadSettings without Validate.
	LoadEnv = loadEnv
	// OldRedis is oldRedis: whether INFO server names a Redis before 7.0.
	OldRedis = oldRedis
	// FailureLine is failureLine: whether a go-redis log line reports a
	// failure (logged at Warn).
	FailureLine = failureLine
)

// ObserverOptions is observerOptions: the observability options that carry s.
func (s Settings) ObserverOptions() []observability.Option { return s.observerOptions() }

// BreakerCooldownUsed is breakerCooldown: the cool-down the breaker uses.
func (s Settings) BreakerCooldownUsed() time.Duration { return s.breakerCooldown() }
