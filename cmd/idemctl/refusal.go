package main

import (
	"context"
	"fmt"

	"github.com/idemkit/idempotency"
)

// pingError returns the error of connect for err, the failed first PING of
// the Redis of s. A Redis that answers but refuses idemctl (its credentials,
// a permission, its database), a TLS handshake that cannot succeed, a server
// that is not Redis, or sentinels that monitor no master of the name are a
// misconfiguration, which waiting does not mend: the error names the
// variable to change and the problem, in the words of the module's start-up
// check (idempotency.RedisMisconfiguration). Anything else is an outage:
// "redis at X is unreachable". Neither ever shows the user name or the
// password.
func pingError(ctx context.Context, err error, s idempotency.Settings) error {
	if merr := idempotency.RedisMisconfiguration(ctx, err, s); merr != nil {
		return merr
	}
	return fmt.Errorf("redis at %s is unreachable: %w", s.RedisAddr(), err)
}
