#!/usr/bin/env bash
# tools/demo.sh (make demo): build the example service, start it on a free
# port with its embedded Redis, play 20 concurrent duplicate payments and a
# key reuse against it (examples/fxapp/demo), then stop it. Exits non-zero
# when the service does not show exactly one charge, so CI can run it.
# Needs only Go and bash.
set -euo pipefail
cd "$(dirname "$0")/.."

GO=${GO:-go}
tmp=$(mktemp -d)
pid=
cleanup() {
	if [[ -n $pid ]] && kill -0 "$pid" 2>/dev/null; then
		kill -TERM "$pid" # fx stops the app gracefully on SIGTERM
		wait "$pid" 2>/dev/null || true
	fi
	rm -rf "$tmp"
}
trap cleanup EXIT

fail() {
	echo "demo: $*" >&2
	echo "--- service log ---" >&2
	cat "$tmp/service.log" >&2 || true
	exit 1
}

echo "building the service and the demo client..."
"$GO" build -o "$tmp/fxapp" ./examples/fxapp
"$GO" build -o "$tmp/demo" ./examples/fxapp/demo

# ADDR port 0: the service takes a free port and logs "serving on http://...".
# Without IDEMPOTENCY_REDIS_URL it starts an embedded Redis.
env -u IDEMPOTENCY_REDIS_URL -u IDEMPOTENCY_REDIS_CLUSTER_ADDRS ADDR=127.0.0.1:0 \
	"$tmp/fxapp" >"$tmp/service.log" 2>&1 &
pid=$!

url=
for ((i = 0; i < 100; i++)); do
	url=$(grep -o 'serving on http://[0-9.:]*' "$tmp/service.log" | head -n 1 | cut -d' ' -f3) || true
	[[ -n $url ]] && break
	kill -0 "$pid" 2>/dev/null || fail "the service exited"
	sleep 0.1
done
[[ -n $url ]] || fail "the service did not start within 10s"
echo "service: $(grep -o 'using an embedded Redis[^;]*' "$tmp/service.log" || echo 'using IDEMPOTENCY_REDIS_URL')"
echo

"$tmp/demo" "$url" || fail "the demo failed (exit $?)"
