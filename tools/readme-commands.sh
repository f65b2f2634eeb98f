#!/usr/bin/env bash
# Runs every command of the README's ```sh blocks, as written, and checks that
# it works; `make readme-commands` runs it, and so CI does.
# TestReadmeCommandsAreChecked fails when the README gains a command this
# script does not run. The test command itself is the Makefile's test target,
# a CI step of its own; set RUN_TESTS=1 to run it here too.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
root=$PWD
GO=${GO:-go}

# An app that uses the module: the build after `go get` or `go mod tidy`.
write_app() {
	cat >main.go <<'GO'
package main

import (
	"go.uber.org/fx"

	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/coordinator"
)

func main() {
	fx.New(idempotency.Module, fx.Invoke(func(*coordinator.Coordinator) {})).Done()
}
GO
}

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# The module has no tagged version and is not published from this checkout,
# so the working tree is served as its only version by a module proxy on disk,
# in front of the real one for the dependencies: a pseudo-version named after
# HEAD, also returned for the query @<HEAD's hash>, as a real proxy resolves a
# commit. The README's commands then run as written.
commit=$(git rev-parse --short=12 HEAD)
version=v0.0.0-$(date -u +%Y%m%d%H%M%S)-$commit
proxy="$tmp/proxy/github.com/idemkit/idempotency/@v"
mkdir -p "$proxy"
printf '%s\n' "$version" >"$proxy/list"
printf '{"Version":"%s","Time":"%s"}\n' "$version" "$(date -u +%Y-%m-%dT%H:%M:%SZ)" >"$proxy/$version.info"
cp "$proxy/$version.info" "$proxy/$commit.info"
cp go.mod "$proxy/$version.mod"
# Tracked and untracked (not ignored) files, as they are in the working tree,
# but not those of a nested module (idemgrpc/, with a go.mod of its own),
# which the go command leaves out of a module's zip too.
git ls-files -z --cached --others --exclude-standard | python3 -c '
import os, sys, zipfile
prefix = "github.com/idemkit/idempotency@" + sys.argv[2] + "/"
names = sorted(set(n for n in sys.stdin.buffer.read().decode().split("\0") if n and os.path.isfile(n)))
nested = [os.path.dirname(n) + "/" for n in names if os.path.basename(n) == "go.mod" and os.path.dirname(n)]
with zipfile.ZipFile(sys.argv[1], "w", zipfile.ZIP_DEFLATED) as z:
    for name in names:
        if not any(name.startswith(d) for d in nested):
            z.write(name, prefix + name)
' "$proxy/$version.zip" "$version"
proxy_env=(GOPROXY="file://$tmp/proxy,$($GO env GOPROXY)" GONOSUMDB=github.com/idemkit/idempotency GOFLAGS=-mod=mod)

echo ">>> go get github.com/idemkit/idempotency"
mkdir "$tmp/app"
(
	cd "$tmp/app"
	export "${proxy_env[@]}"
	$GO mod init example.com/readme >/dev/null 2>&1
	go get github.com/idemkit/idempotency
	grep -qF "github.com/idemkit/idempotency $version" go.mod || { cat go.mod; echo "go.mod does not require $version"; exit 1; }
	write_app
	$GO mod tidy
	$GO build -o /dev/null .
)
echo "ok: the module installs as a pseudo-version and an app using it builds"

# The README's `go get github.com/idemkit/idempotency@<commit>`, with HEAD.
echo ">>> go get github.com/idemkit/idempotency@$commit"
mkdir "$tmp/app-commit"
(
	cd "$tmp/app-commit"
	export "${proxy_env[@]}"
	$GO mod init example.com/readme >/dev/null 2>&1
	go get "github.com/idemkit/idempotency@$commit"
	grep -qF "github.com/idemkit/idempotency $version" go.mod || { cat go.mod; echo "go.mod does not require $version"; exit 1; }
)
echo "ok: @<commit> resolves to the pseudo-version $version"

# The local checkout in ../idempotency is this one. No module proxy serves
# idempotency here: the replace directive alone must resolve it.
ln -s "$root" "$tmp/idempotency"
mkdir "$tmp/app-replace"
(
	cd "$tmp/app-replace"
	$GO mod init example.com/readme >/dev/null 2>&1
	write_app
	echo ">>> go mod edit -replace github.com/idemkit/idempotency=../idempotency"
	go mod edit -replace github.com/idemkit/idempotency=../idempotency
	echo ">>> go mod tidy"
	go mod tidy
	grep -q "=> ../idempotency" go.mod || { cat go.mod; echo "go.mod has no replace directive"; exit 1; }
	$GO build -o /dev/null .
)
echo "ok: an app using the module through a replace directive builds"

# The adapter modules from the same checkout: one replace for each module
# imported. No module proxy serves them here either.
mkdir "$tmp/app-adapters"
(
	cd "$tmp/app-adapters"
	$GO mod init example.com/readme >/dev/null 2>&1
	cat >main.go <<'GO'
package main

import (
	"fmt"

	"github.com/idemkit/idempotency/idemconnect"
	"github.com/idemkit/idempotency/idemecho"
	"github.com/idemkit/idempotency/idemgin"
	"github.com/idemkit/idempotency/idemgrpc"
	"github.com/idemkit/idempotency/idempg"
	"github.com/idemkit/idempotency/idemwatermill"
	"github.com/idemkit/idempotency/observability/mixin"
)

func main() {
	fmt.Println(idemgrpc.ContextWithKey, idemconnect.ContextWithKey, idemgin.Middleware, idemecho.Middleware,
		idemwatermill.IsDeadLetter, idempg.SchemaVersion, mixin.DashboardUID)
}
GO
	go mod edit -replace github.com/idemkit/idempotency=../idempotency
	echo ">>> go mod edit -replace github.com/idemkit/idempotency/idemgrpc=../idempotency/idemgrpc"
	go mod edit -replace github.com/idemkit/idempotency/idemgrpc=../idempotency/idemgrpc
	echo ">>> go mod edit -replace github.com/idemkit/idempotency/idemconnect=../idempotency/idemconnect"
	go mod edit -replace github.com/idemkit/idempotency/idemconnect=../idempotency/idemconnect
	echo ">>> go mod edit -replace github.com/idemkit/idempotency/idemgin=../idempotency/idemgin"
	go mod edit -replace github.com/idemkit/idempotency/idemgin=../idempotency/idemgin
	echo ">>> go mod edit -replace github.com/idemkit/idempotency/idemecho=../idempotency/idemecho"
	go mod edit -replace github.com/idemkit/idempotency/idemecho=../idempotency/idemecho
	echo ">>> go mod edit -replace github.com/idemkit/idempotency/idemwatermill=../idempotency/idemwatermill"
	go mod edit -replace github.com/idemkit/idempotency/idemwatermill=../idempotency/idemwatermill
	echo ">>> go mod edit -replace github.com/idemkit/idempotency/idempg=../idempotency/idempg"
	go mod edit -replace github.com/idemkit/idempotency/idempg=../idempotency/idempg
	echo ">>> go mod edit -replace github.com/idemkit/idempotency/observability/mixin=../idempotency/observability/mixin"
	go mod edit -replace github.com/idemkit/idempotency/observability/mixin=../idempotency/observability/mixin
	go mod tidy
	$GO build -o /dev/null .
	# The mixin's checks are a module of their own: none of their
	# dependencies reaches an app that imports the mixin.
	if grep -qE 'prometheus/prometheus|k8s\.io/|grafana-foundation-sdk' go.mod; then
		cat go.mod
		echo "the mixin brings its checks' dependencies"
		exit 1
	fi
)
echo "ok: an app using the adapter modules through replace directives builds"

echo ">>> go run ./examples/fxapp"
log="$tmp/fxapp.log"
env -u IDEMPOTENCY_REDIS_URL go run ./examples/fxapp >"$log" 2>&1 &
pid=$!
for _ in $(seq 1 300); do
	if grep -q "serving on" "$log"; then break; fi
	if ! kill -0 "$pid" 2>/dev/null; then cat "$log"; echo "fxapp exited early"; exit 1; fi
	sleep 0.1
done
grep -q "serving on" "$log" || { cat "$log"; echo "fxapp did not start serving"; exit 1; }
grep -q "embedded Redis (miniredis)" "$log" || { cat "$log"; echo "fxapp did not say it uses an embedded Redis"; exit 1; }
url=$(grep -o 'http://[0-9.:]*' "$log" | head -1)
if command -v curl >/dev/null 2>&1; then
	curl -fsS "$url/ledger" >/dev/null || { cat "$log"; echo "GET $url/ledger failed"; exit 1; }
fi
# go run's child is the server: signal the whole process group politely.
kill -INT "$pid" 2>/dev/null || true
pkill -INT -P "$pid" 2>/dev/null || true
wait "$pid" 2>/dev/null || true
echo "ok: fxapp served on $url and stopped"

echo ">>> make demo"
make demo

if [ "${RUN_TESTS:-0}" = 1 ]; then
	echo ">>> make test"
	make test
fi
echo ">>> readme-commands: all README commands work"
