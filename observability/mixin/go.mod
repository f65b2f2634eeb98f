module github.com/idemkit/idempotency/observability/mixin

go 1.26.0

replace github.com/idemkit/idempotency => ../..

require github.com/idemkit/idempotency v0.0.0-20261205223430-ee7f0311b87b
