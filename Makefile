# Targets for developers and CI. `make ci` is the whole CI check; .ci/run (what
# CI runs on a clean clone) installs what is missing and then runs the same
# CI_TARGETS one by one, so this file is the only definition of each check.

SHELL := bash

GO ?= go
# staticcheck 2026.2.2 (module version v0.8.2) understands Go 1.26.
STATICCHECK_VERSION ?= v0.8.2
STATICCHECK ?= $(GO) run honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION)

.PHONY: all build test test-reliability test-reliability-short test-valkey lint fmt-check vet staticcheck bench bench-table bench-pg tidy-check readme-commands install-commands rules-check prometheus-e2e user-build require-core release release-dry-run ci ci-targets demo

all: build

build:
	$(GO) build ./...

# The modules of the repository: the core; the gRPC adapter, a module of its
# own so that the core's users do not get gRPC in their module graph
# (docs/grpc.md); the Connect, gin and Echo adapters (docs/connect.md,
# docs/gin.md, docs/echo.md) and the Watermill adapter (docs/consumers.md),
# for the same reason; the PostgreSQL store (idempg, package doc), for pgx;
# the
# monitoring mixin (dashboard and rules; it requires only
# the core); and the mixin's checks, a test-only module because they need the
# Prometheus server module for its PromQL parser (docs/observability.md).
# Every check below runs in each. A nested module is outside the root's
# ./..., hence the loops.
MODULES := . idemgrpc idemconnect idemgin idemecho idemwatermill idempg cmd/idemctl observability/mixin observability/mixin/mixintest
# The modules that build against the checkout through a go.work of their own
# instead of replace directives (cmd/idemctl, so that `go install ...@version`
# works: docs/releasing.md, "idemctl's workspace"). go mod tidy ignores a
# workspace, so their tidiness is checked where their requirements resolve:
# in user-build, against this repository's history.
WORKSPACE_MODULES := cmd/idemctl
each = $(call each_of,$(MODULES),$(1))
each_of = set -e; for m in $(1); do echo ">>> $$m: $(2)"; (cd $$m && $(2)); done

# The README's test command. go test prints a package's line when the package
# is done, and the first ones need a minute to build with -race: say so.
test:
	@echo ">>> make test: go test -race -count=1 ./... in each module ($(MODULES)); building with -race first, then one line per package as it finishes"
	@$(call each,$(GO) test -race -count=1 ./...)

# The reliability suite (reliability/, docs/reliability.md): storms of
# duplicate calls on real Redis and a Redis Cluster, with faults, every history
# checked. `test` skips its storms. The short run covers every fault kind and
# every mode pair (about five minutes on two cores) and is a CI target; the full
# one runs every fault in every mode pair with longer storms, and prints each
# scenario's figures. IDEMPOTENCY_TEST_RELIABILITY_REPORT=file appends them to
# file, tab-separated; IDEMPOTENCY_TEST_RELIABILITY_SEED replays a storm's keys.
test-reliability:
	IDEMPOTENCY_TEST_RELIABILITY=full $(GO) test -race -count=1 -timeout 90m -v ./reliability/

test-reliability-short:
	IDEMPOTENCY_TEST_RELIABILITY=short $(GO) test -race -count=1 -timeout 20m ./reliability/

# The Redis tests on Valkey 8.0.1 instead of redis-server (docs/operations.md,
# "Valkey"): the store's conformance suite and every Redis test of redisrepo,
# the root package, idemconsume, observability, the store's coalescing and the test rigs, and idemctl's
# (sentinel and cluster included), then the short reliability suite.
# VALKEY_BUILD (the shared tools' build-valkey.sh, found beside the checkout
# by default) builds valkey-server and valkey-cli from the shared source into its
# cache folder the first time (minutes) and prints the folder; VALKEY_DIR, a
# folder that holds both, skips it. internal/redistest starts
# IDEMPOTENCY_TEST_REDIS_SERVER instead of redis-server, and the CLI beside it.
# The first of: beside the checkout, beside its parent.
VALKEY_CANDIDATES := $(abspath $(dir $(lastword $(MAKEFILE_LIST)))../shared/tools/build-valkey.sh) $(abspath $(dir $(lastword $(MAKEFILE_LIST)))../../shared/tools/build-valkey.sh)
VALKEY_BUILD ?= $(or $(firstword $(wildcard $(VALKEY_CANDIDATES))),$(firstword $(VALKEY_CANDIDATES)))
VALKEY_DIR ?=
VALKEY_PACKAGES := ./internal/redistest/ ./internal/coalesce/ ./redisrepo/... . ./idemconsume/... ./observability/
test-valkey:
	@set -e; dir='$(VALKEY_DIR)'; \
	if [ -z "$$dir" ]; then \
		[ -f '$(VALKEY_BUILD)' ] || { echo "test-valkey: no $(VALKEY_BUILD): set VALKEY_BUILD to the shared tools' build-valkey.sh, or VALKEY_DIR to a folder with valkey-server and valkey-cli"; exit 1; }; \
		echo ">>> test-valkey: $(VALKEY_BUILD) (builds Valkey once, then prints its cached folder)"; \
		dir=$$(bash '$(VALKEY_BUILD)') || { echo "test-valkey: $(VALKEY_BUILD) failed (it needs ../vendor/valkey-8.0.1.tar.gz beside its folder, cc and make)"; exit 1; }; \
	fi; \
	for b in valkey-server valkey-cli; do [ -x "$$dir/$$b" ] || { echo "test-valkey: no executable $$dir/$$b"; exit 1; }; done; \
	"$$dir/valkey-server" --version; \
	export IDEMPOTENCY_TEST_REDIS_SERVER="$$dir/valkey-server" IDEMPOTENCY_TEST_REDIS_CLI="$$dir/valkey-cli"; \
	$(GO) test -race -count=1 -timeout 20m $(VALKEY_PACKAGES); \
	(cd cmd/idemctl && $(GO) test -race -count=1 -timeout 20m .); \
	IDEMPOTENCY_TEST_RELIABILITY=short $(GO) test -race -count=1 -timeout 20m ./reliability/

lint: fmt-check vet staticcheck

# gofmt -l exits 0 when it lists files and non-zero only when it cannot parse
# one: both fail the check.
fmt-check:
	@out="$$(gofmt -l .)" || { echo "gofmt failed"; exit 1; }; \
	if [ -n "$$out" ]; then echo "gofmt needed on:"; echo "$$out"; exit 1; fi

vet:
	@$(call each,$(GO) vet ./...)

# The default checks, plus the doc-comment ones: every exported name is
# documented in form. A staticcheck that cannot be fetched fails the target.
STATICCHECK_CHECKS := inherit,ST1000,ST1020,ST1021,ST1022
staticcheck:
	@$(call each,$(STATICCHECK) -checks $(STATICCHECK_CHECKS) ./...)

# Every benchmark of every package, six runs each, into $(BENCH_OUT) (*.out is
# in .gitignore); about nine minutes on two cores. The six runs are six
# passes of -count 1, not one pass of -count 6, so that a machine that gets
# busier or quieter meanwhile moves idemkit and raw alike (with -count 6 the
# six repetitions of one sub-benchmark run back to back). benchmarks/ puts
# each flow of the library (impl=idemkit) beside raw go-redis (impl=raw) on
# one redis-server that it starts itself (it skips without redis-server).
# bench-table prints those side by side, medians of the six runs; benchstat
# compares two runs:
#   make bench BENCH_OUT=old.out; <change>; make bench
#   go run golang.org/x/perf/cmd/benchstat@latest old.out bench.out
#   go run golang.org/x/perf/cmd/benchstat@latest -col /impl bench.out
BENCH_OUT ?= bench.out
BENCH_COUNT ?= 6
bench:
	set -o pipefail; : > $(BENCH_OUT); for i in $$(seq $(BENCH_COUNT)); do \
		$(GO) test -run '^$$' -bench . -benchmem -benchtime 1s -count 1 -timeout 30m ./... | tee -a $(BENCH_OUT) || exit 1; \
	done

bench-table:
	$(GO) run ./tools/benchtable $(BENCH_OUT)

# The PostgreSQL store's transactional call beside a hand-written INSERT ...
# ON CONFLICT transaction and beside the Redis store (docs/performance.md,
# "PostgreSQL: the transactional call"), six passes into idempg/$(BENCH_OUT);
# about ten minutes on two cores. Needs PostgreSQL and redis-server.
#   go run golang.org/x/perf/cmd/benchstat@latest -col '/impl@(floor idempg)' idempg/bench.out
bench-pg:
	set -o pipefail; cd idempg && : > $(BENCH_OUT) && for i in $$(seq $(BENCH_COUNT)); do \
		IDEMPOTENCY_TEST_REQUIRE_POSTGRES=1 $(GO) test -run '^$$' -bench Flows -benchmem -benchtime 2s -count 1 -timeout 30m . | tee -a $(BENCH_OUT) || exit 1; \
	done

tidy-check:
	@$(call each_of,$(filter-out $(WORKSPACE_MODULES),$(MODULES)),$(GO) mod tidy -diff)

# Every command of the README's ```sh blocks, as written (go get, go mod edit
# -replace, go run ./examples/fxapp, make demo); the test command is `test`.
readme-commands:
	GO=$(GO) bash tools/readme-commands.sh

# The install lines of each adapter's page (and idempg's), as written, in a
# new module beside this checkout; then a program importing the module builds.
install-commands:
	GO=$(GO) bash tools/install-commands.sh

# The Prometheus rules of observability/mixin (docs/observability.md#alerts):
# they parse, and promtool's unit tests show every alert firing on the
# condition it names and silent on a healthy series. Needs promtool (Debian
# package prometheus; .ci/run installs it).
rules-check:
	promtool check rules observability/mixin/rules.yml
	cd observability/mixin && promtool test rules rules_test.yml

# The metrics and the rules against a real Prometheus: starts redis-server,
# examples/fxapp on it in on-storage-error mode raise, and a Prometheus that
# scrapes it every second with observability/mixin/rules.yml loaded; sends
# misses and hits, kills redis-server, and checks through Prometheus's HTTP
# API the series, a recording rule, and that the storage-error alerts go
# pending. About 15s after the build. Needs redis-server, prometheus, curl
# and jq.
prometheus-e2e:
	GO=$(GO) bash tools/prometheus-e2e.sh

# Each published nested module (idemgrpc, observability/mixin) built and
# vetted as a user who requires it resolves it: a copy without its replace,
# against the core version its go.mod requires, fetched from this
# repository's git history as from GitHub (docs/releasing.md). About 15s once
# the build cache holds the dependencies.
user-build:
	bash tools/user-build.sh

# Moves the nested modules' requirement of the core to the pseudo-version of
# REV (a commit of the core; default HEAD), for when user-build fails because
# a nested module uses a newer core (docs/releasing.md).
REV ?= HEAD
require-core:
	bash tools/require-core.sh $(REV)

# The lockstep release (docs/releasing.md): make release VERSION=vX.Y.Z
# commits the nested modules' requirement of the core at VERSION and tags the
# core and every published nested module; release-dry-run does all of it in a
# throwaway clone and prints it (VERSION defaults to the next minor version).
release:
	@test -n "$(VERSION)" || { echo "usage: make release VERSION=vX.Y.Z"; exit 1; }
	bash tools/release.sh $(VERSION)

release-dry-run:
	bash tools/release.sh -n $(VERSION)

# The CI checks, in the order .ci/run runs them. `make ci` stops at the first
# failure (`make -k ci` runs them all); .ci/run always runs them all.
CI_TARGETS := fmt-check vet tidy-check user-build release-dry-run staticcheck rules-check test test-reliability-short test-valkey prometheus-e2e readme-commands install-commands

ci: $(CI_TARGETS)

# Prints CI_TARGETS, for .ci/run.
ci-targets:
	@echo $(CI_TARGETS)

# Starts examples/fxapp on a free port (embedded Redis), sends it 20 concurrent
# duplicate payments and a key reuse, prints the statuses and the ledger, and
# stops it. Fails unless the ledger shows exactly one charge.
demo:
	GO=$(GO) bash tools/demo.sh
