// Package paymentspb is the generated code of payments.proto: the payments
// service that idemgrpc's tests and example serve. CI does not regenerate
// it; after editing payments.proto, run go generate with protoc,
// protoc-gen-go v1.36.12 and protoc-gen-go-grpc v1.6.2 on PATH.
package paymentspb

//go:generate protoc --go_out=. --go_opt=paths=source_relative --go-grpc_out=. --go-grpc_opt=paths=source_relative payments.proto
