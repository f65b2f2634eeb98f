# Targets for developers and CI; .ci/run is what CI runs on a clean clone.

SHELL := bash

GO ?= go
# staticcheck 2026.2.2 (module version v0.8.2) understands Go 1.26.
STATICCHECK_VERSION ?= v0.8.2
STATICCHECK ?= $(GO) run honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION)

.PHONY: all build test lint fmt-check vet staticcheck bench tidy-check ci demo

all: build

build:
	$(GO) build ./...

# The README's test command.
test:
	$(GO) test -race -count=1 ./...

lint: fmt-check vet staticcheck

fmt-check:
	@out="$$(gofmt -l .)"; if [ -n "$$out" ]; then echo "gofmt needed on:"; echo "$$out"; exit 1; fi

vet:
	$(GO) vet ./...

staticcheck:
	$(STATICCHECK) -checks inherit,ST1000,ST1020,ST1021,ST1022 ./...

# Six runs per benchmark, so that benchstat can compare two runs (*.out is
# in .gitignore):
#   make bench BENCH_OUT=old.out; <change>; make bench
#   go run golang.org/x/perf/cmd/benchstat@latest old.out bench.out
BENCH_OUT ?= bench.out
bench:
	set -o pipefail; $(GO) test -run '^$$' -bench . -benchmem -count 6 ./... | tee $(BENCH_OUT)

tidy-check:
	$(GO) mod tidy -diff

ci: lint test

# Starts examples/fxapp on a free port (embedded Redis), sends it 20 concurrent
# duplicate payments and a key reuse, prints the statuses and the ledger, and
# stops it. Fails unless the ledger shows exactly one charge.
demo:
	GO=$(GO) bash scripts/demo.sh
