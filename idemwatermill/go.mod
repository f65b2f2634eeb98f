module github.com/idemkit/idempotency/idemwatermill

go 1.26.0

require (
	github.com/ThreeDotsLabs/watermill v1.5.1
	github.com/idemkit/idempotency v0.0.0-20261207200443-820952f282fb
	github.com/nats-io/nats.go v1.37.0
)

require (
	github.com/ThreeDotsLabs/watermill-nats/v2 v2.1.3
	github.com/alicebob/miniredis/v2 v2.40.0 // indirect
	github.com/cenkalti/backoff/v5 v5.0.3 // indirect
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	github.com/klauspost/compress v1.18.0 // indirect
	github.com/nats-io/nkeys v0.4.7 // indirect
	github.com/nats-io/nuid v1.0.1 // indirect
	github.com/sony/gobreaker v1.0.0 // indirect
	github.com/yuin/gopher-lua v1.1.1 // indirect
	go.uber.org/atomic v1.12.0 // indirect
	golang.org/x/crypto v0.26.0 // indirect
	golang.org/x/sys v0.48.0 // indirect
	golang.org/x/text v0.17.0 // indirect
)

require (
	github.com/google/uuid v1.6.0 // indirect
	github.com/lithammer/shortuuid/v3 v3.0.7 // indirect
	github.com/oklog/ulid v1.3.1 // indirect
	github.com/pkg/errors v0.9.1 // indirect
	github.com/redis/go-redis/v9 v9.23.0
	go.uber.org/goleak v1.3.0
)

replace github.com/idemkit/idempotency => ../
