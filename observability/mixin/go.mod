module github.com/idemkit/idempotency/observability/mixin

go 1.26.0

replace github.com/idemkit/idempotency => ../..

require github.com/idemkit/idempotency v0.0.0-20261207200443-820952f282fb
