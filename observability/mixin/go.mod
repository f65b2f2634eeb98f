module github.com/idemkit/idempotency/observability/mixin

go 1.26.0

replace github.com/idemkit/idempotency => ../..
