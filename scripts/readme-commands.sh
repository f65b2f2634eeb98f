#!/usr/bin/env bash
# Runs every command of the README's ```sh blocks, as written, and checks that
# it works. TestReadmeCommandsAreChecked fails when the README gains a command
# this script does not run. The test command itself is run by .ci/run's own
# test step; set RUN_TESTS=1 to run it here too.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
root=$PWD
GO=${GO:-go}

echo ">>> go get github.com/idemkit/idempotency"
# The module is not published from this checkout, so this checkout is served
# as its only version by a module proxy on disk, in front of the real one for
# the dependencies; the command then runs as written.
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
version=v0.0.0-$(date -u +%Y%m%d%H%M%S)-000000000000
proxy="$tmp/proxy/github.com/idemkit/idempotency/@v"
mkdir -p "$proxy"
printf '%s\n' "$version" >"$proxy/list"
printf '{"Version":"%s","Time":"%s"}\n' "$version" "$(date -u +%Y-%m-%dT%H:%M:%SZ)" >"$proxy/$version.info"
cp go.mod "$proxy/$version.mod"
git ls-files -z | python3 -c '
import sys, zipfile
prefix = "github.com/idemkit/idempotency@" + sys.argv[2] + "/"
with zipfile.ZipFile(sys.argv[1], "w", zipfile.ZIP_DEFLATED) as z:
    for name in sys.stdin.buffer.read().decode().split("\0"):
        if name:
            z.write(name, prefix + name)
' "$proxy/$version.zip" "$version"
mkdir "$tmp/app"
(
	cd "$tmp/app"
	export GOPROXY="file://$tmp/proxy,$(go env GOPROXY)" GONOSUMDB=github.com/idemkit/idempotency GOFLAGS=-mod=mod
	$GO mod init example.com/readme >/dev/null 2>&1
	go get github.com/idemkit/idempotency
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
	$GO mod tidy
	$GO build -o /dev/null .
)
echo "ok: the module installs and an app using it builds"

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
	echo ">>> go test -race -count=1 ./..."
	go test -race -count=1 ./...
fi
echo ">>> readme-commands: all README commands work"
