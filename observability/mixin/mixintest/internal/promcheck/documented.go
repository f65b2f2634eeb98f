package promcheck

import (
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"

	"github.com/idemkit/idempotency/coordinator/idemevent"

	"github.com/idemkit/idempotency/coordinator"
	"github.com/idemkit/idempotency/idemconsume"
	"github.com/idemkit/idempotency/observability"
)

// unknownValue is the value the observer counts an event under when its
// error type, method or wait outcome is outside the coordinator's lists
// (docs/observability.md, "Metrics").
const unknownValue = "unknown"

// domain is the set of values the library documents for one label: an
// enumeration, or for open labels (operation, le) a check of one value.
type domain struct {
	values map[string]bool
	check  func(string) error
}

func enum[T ~string](lists ...[]T) domain {
	d := domain{values: map[string]bool{}}
	for _, l := range lists {
		for _, v := range l {
			d.values[string(v)] = true
		}
	}
	return d
}

// valid reports whether v is a documented value.
func (d domain) valid(v string) error {
	if d.check != nil {
		return d.check(v)
	}
	if d.values[v] {
		return nil
	}
	return fmt.Errorf("%q is not one of %s", v, d)
}

func (d domain) String() string {
	if d.check != nil {
		return "the open set"
	}
	vs := make([]string, 0, len(d.values))
	for v := range d.values {
		vs = append(vs, v)
	}
	sort.Strings(vs)
	return strings.Join(vs, ", ")
}

// StorageResults are the values of the result label of
// storage_duration_seconds.
var StorageResults = []string{"ok", "error", "timeout", "canceled"}

// RefusalReasons are the values of the reason label of
// storage_refusals_total: why Redis refused a store call (credentials,
// permission, database) or that the module's circuit breaker was open.
var RefusalReasons = []string{"credentials", "permission", "database", "breaker_open"}

// RequestOutcomes are the values of the outcome label of requests_total:
// the names of the events that count there.
func RequestOutcomes() []string {
	return []string{idemevent.Hit.String(), idemevent.Miss.String(), idemevent.InFlight.String(),
		idemevent.NotReplayable.String()}
}

var operationDomain = domain{check: func(v string) error {
	if v == observability.OtherOperation {
		return nil
	}
	if err := coordinator.ValidateOperation(v); err != nil {
		return fmt.Errorf("%q is not an operation name: %w", v, err)
	}
	return nil
}}

var leDomain = domain{check: func(v string) error {
	if _, err := strconv.ParseFloat(v, 64); err != nil {
		return fmt.Errorf("le %q is not a number", v)
	}
	return nil
}}

// documented maps a metric's name without namespace and without a
// histogram suffix to the documented values of each of its labels. The
// lists come from the coordinator, as the observer's do.
var documented = map[string]map[string]domain{
	"idempotency_requests_total": {
		"operation": operationDomain,
		"outcome":   enum(RequestOutcomes()),
	},
	"idempotency_errors_total": {
		"operation":  operationDomain,
		"error_type": enum(idemevent.ErrorTypes(), []idemevent.ErrorType{unknownValue}),
	},
	"idempotency_stored_total": {
		"operation": operationDomain,
	},
	"idempotency_unprotected_total": {
		"operation": operationDomain,
		"method":    enum(idemevent.Methods(), []idemevent.Method{idemevent.MethodNone, unknownValue}),
	},
	"idempotency_wait_duration_seconds": {
		"operation": operationDomain,
		"outcome":   enum(idemevent.WaitOutcomes(), []idemevent.WaitOutcome{unknownValue}),
		"le":        leDomain,
	},
	"idempotency_storage_duration_seconds": {
		"method": enum(idemevent.Methods(), []idemevent.Method{unknownValue}),
		"result": enum(StorageResults),
		"le":     leDomain,
	},
	"idempotency_storage_refusals_total": {
		"operation": operationDomain,
		"reason":    enum(RefusalReasons),
	},
	"idempotency_bulk_keys_total": {
		"operation": operationDomain,
		"outcome":   enum([]string{"hit", "miss"}),
	},
	"idempotency_consumer_deliveries_total": {
		"operation": operationDomain,
		"decision":  enum([]string{idemconsume.Ack.String(), idemconsume.Retry.String(), idemconsume.DeadLetter.String()}),
		"reason":    enum(idemconsume.Reasons()),
	},
	"idempotency_consumer_dead_letters_total": {
		"operation": operationDomain,
		"reason":    enum(deadLetterReasons()),
	},
	"idempotency_consumer_claims_total": {
		"operation": operationDomain,
	},
	"idempotency_consumer_errors_total": {
		"operation": operationDomain,
		"command":   commandDomain,
	},
}

// deadLetterReasons are the reasons that go with idemconsume.DeadLetter.
func deadLetterReasons() []idemconsume.Reason {
	var out []idemconsume.Reason
	for _, r := range idemconsume.Reasons() {
		if r.Action() == idemconsume.DeadLetter {
			out = append(out, r)
		}
	}
	return out
}

// commandDomain is the command label of consumer_errors_total: an adapter's
// commands, lower case (redisstream.Commands), or "unknown".
var commandDomain = domain{check: func(v string) error {
	for _, r := range v {
		if (r < 'a' || r > 'z') && r != '_' {
			return fmt.Errorf("command %q is not a lower-case command name", v)
		}
	}
	if v == "" {
		return errors.New("command is empty")
	}
	return nil
}}

// baseName returns the key of documented for a series name: the name from
// "idempotency_" on, without _bucket, _sum or _count. ok is false for a name
// that is not the library's.
func baseName(series string) (string, bool) {
	i := strings.Index(series, "idempotency_")
	if i < 0 || (i > 0 && series[i-1] != '_') {
		return "", false
	}
	name := series[i:]
	if _, ok := documented[name]; ok {
		return name, true
	}
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		if b, ok := strings.CutSuffix(name, suffix); ok {
			if _, ok := documented[b]; ok {
				return b, true
			}
		}
	}
	return "", false
}

// documentedDomain returns the documented values of label on series name;
// for a recorded series, the union over every library metric with that
// label. ok is false when nothing is documented.
func documentedDomain(name string, se *Series, label string) (domain, bool) {
	if !se.Recorded {
		b, ok := baseName(name)
		if !ok {
			return domain{}, false
		}
		d, ok := documented[b][label]
		return d, ok
	}
	var union domain
	found := false
	for _, labels := range documented {
		d, ok := labels[label]
		if !ok {
			continue
		}
		if d.check != nil {
			return d, true
		}
		if !found {
			union = domain{values: map[string]bool{}}
			found = true
		}
		for v := range d.values {
			union.values[v] = true
		}
	}
	return union, found
}
