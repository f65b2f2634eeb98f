module github.com/idemkit/idempotency/observability/mixin

go 1.26.0

replace github.com/idemkit/idempotency => ../..

require github.com/idemkit/idempotency v0.0.0-20261202042629-87a4c4963c89
