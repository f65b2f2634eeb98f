#!/usr/bin/env bash
# tools/prometheus-e2e.sh (make prometheus-e2e): the metrics and the alert
# rules against a real Prometheus. It starts its own redis-server, the example
# service (examples/fxapp) on it in on-storage-error mode `raise`, and a
# Prometheus that scrapes the service every second and evaluates
# observability/mixin/rules.yml every second. It then
#
#   1. sends payments: new keys (misses) and sequential duplicates (hits,
#      replayed), and checks that Prometheus has idempotency_requests_total
#      with exactly those counts by operation and outcome, the six metric
#      families, and the replay-ratio recording rule at hits/(hits+misses);
#   2. kills redis-server (SIGKILL) while payments continue, each answered 503,
#      and checks that Prometheus sees the storage errors
#      (idempotency_errors_total{error_type="storage_reserve_error"},
#      idempotency_storage_duration_seconds_count{method="reserve",result=~"error|timeout"},
#      the error-ratio recording rule), that the storage-error alerts of
#      rules.yml (IdempotencyStorageErrorRatioHigh, IdempotencyStorageErrors)
#      go pending or firing with their expressions returning a value, and that
#      nothing ran unprotected (IdempotencyUnprotectedRuns stays inactive);
#   3. checks that every rule of rules.yml evaluated without error.
#
# Every wait polls against a deadline; the run after the build is bounded by
# PROM_E2E_TIMEOUT seconds (default 110). On failure it prints the end of every
# process's log and Prometheus's targets, rules and alerts.
#
# Needs go, redis-server, prometheus (2.x; promtool is used when present),
# curl and jq: on Debian, `apt-get install redis-server prometheus curl jq`.
#
# Environment: GO (default go); PROM_E2E_RULES, the rules file (default the
# repository's observability/mixin/rules.yml); PROM_E2E_STORAGE_ALERTS, the
# names of the storage-error alerts in it (default
# "IdempotencyStorageErrorRatioHigh IdempotencyStorageErrors"); PROM_E2E_TIMEOUT;
# PROM_E2E_KEEP=1 keeps the temporary directory (logs, prometheus.yml).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

GO=${GO:-go}
RULES=${PROM_E2E_RULES:-$root/observability/mixin/rules.yml}
TIMEOUT=${PROM_E2E_TIMEOUT:-110}
STORAGE_ALERTS=${PROM_E2E_STORAGE_ALERTS:-IdempotencyStorageErrorRatioHigh IdempotencyStorageErrors}
JOB=idemkit-fxapp
OP=POST.payments # the operation of POST /payments (server.go)
NKEYS=5          # new keys: NKEYS misses
NDUPS=3          # sequential duplicates of each: NKEYS*NDUPS hits

started=$SECONDS
say() { printf 'prometheus-e2e [%3ds]: %s\n' $((SECONDS - started)) "$*"; }

tmp=$(mktemp -d "${TMPDIR:-/tmp}/prometheus-e2e.XXXXXX")
redis_pid= app_pid= prom_pid= traffic_pid=
app= prom=
failing=

# stop NAME PID [SIGNAL]: signals PID and waits up to 10s for it, then kills it.
stop() {
	local name=$1 pid=$2 sig=${3:-TERM} i
	[[ -n $pid ]] || return 0
	kill -0 "$pid" 2>/dev/null || { wait "$pid" 2>/dev/null || true; return 0; }
	kill "-$sig" "$pid" 2>/dev/null || true
	for ((i = 0; i < 100; i++)); do
		kill -0 "$pid" 2>/dev/null || break
		sleep 0.1
	done
	if kill -0 "$pid" 2>/dev/null; then
		echo "prometheus-e2e: $name (pid $pid) did not stop within 10s; killing it" >&2
		kill -KILL "$pid" 2>/dev/null || true
	fi
	# The braces take bash's "Killed" notice of a SIGKILLed job to /dev/null.
	{ wait "$pid"; } 2>/dev/null || true
}

cleanup() {
	local rc=$?
	trap - EXIT INT TERM
	stop "traffic loop" "$traffic_pid"
	stop "fxapp" "$app_pid"
	stop "prometheus" "$prom_pid"
	stop "redis-server" "$redis_pid"
	if [[ ${PROM_E2E_KEEP:-} == 1 ]]; then
		echo "prometheus-e2e: kept $tmp" >&2
	else
		rm -rf "$tmp"
	fi
	exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# diagnostics prints what a failure needs to be understood: the end of every
# log, and what Prometheus says about its targets, rules and alerts.
diagnostics() {
	local f
	for f in redis.log fxapp.log prometheus.log outage.codes; do
		[[ -s $tmp/$f ]] || continue
		echo "--- last 40 lines of $f ---" >&2
		tail -n 40 "$tmp/$f" >&2
	done
	if [[ -n $prom ]]; then
		local -A summary=(
			[targets]='.data.activeTargets[] | {scrapeUrl, health, lastError, lastScrape}'
			[rules]='.data.groups[].rules[] | {name, type, health, state, lastError}'
			[alerts]='.data.alerts[] | {alertname: .labels.alertname, state, labels, value}'
		)
		for f in targets rules alerts; do
			echo "--- $prom/api/v1/$f ---" >&2
			curl -sS --max-time 5 "$prom/api/v1/$f" 2>&1 |
				{ jq -c "${summary[$f]} | del(..|nulls)" 2>/dev/null || cat; } | head -n 60 >&2 || true
		done
	fi
}

fail() {
	echo "prometheus-e2e: FAILED after $((SECONDS - started))s: $*" >&2
	if [[ -z $failing ]]; then
		failing=1
		diagnostics
	fi
	exit 1
}

missing=()
for cmd in "$GO" redis-server prometheus curl jq; do
	command -v "$cmd" >/dev/null 2>&1 || missing+=("$cmd")
done
((${#missing[@]} == 0)) || fail "missing commands: ${missing[*]} (Debian: apt-get install -y redis-server prometheus curl jq)"
[[ -f $RULES ]] || fail "no rules file at $RULES"

# free_port prints a port nobody listens on, below the ephemeral range (so no
# outgoing connection holds it). A start that loses a race for it is retried.
free_port() {
	local p i
	for ((i = 0; i < 100; i++)); do
		p=$((20000 + RANDOM % 12000))
		if ! (exec 2>/dev/null 3<>"/dev/tcp/127.0.0.1/$p"); then
			echo "$p"
			return 0
		fi
	done
	return 1
}

# until_ok DESCRIPTION SECONDS COMMAND...: runs COMMAND every 0.3s until it
# succeeds; fails after SECONDS, or at the run's deadline, whichever is first.
until_ok() {
	local desc=$1 budget=$2
	shift 2
	local begin=$SECONDS end=$((SECONDS + budget))
	((end <= deadline)) || end=$deadline
	while ! "$@"; do
		if ((SECONDS >= end)); then
			fail "timed out after $((SECONDS - begin))s waiting for $desc"
		fi
		sleep 0.3
	done
}

redis_ping() {
	local reply
	reply=$(
		exec 2>/dev/null
		exec 3<>"/dev/tcp/127.0.0.1/$1" || exit 1
		printf 'PING\r\n' >&3
		IFS= read -r -t 2 line <&3 || exit 1
		printf '%s' "$line"
	) 2>/dev/null || return 1
	[[ $reply == $'+PONG\r' ]]
}

alive() { kill -0 "$1" 2>/dev/null; }

# --- build (not counted in the run's deadline) -------------------------------
say "building examples/fxapp"
"$GO" build -o "$tmp/fxapp" ./examples/fxapp || fail "go build ./examples/fxapp failed"
deadline=$((SECONDS + TIMEOUT))

# --- redis-server --------------------------------------------------------------
for attempt in 1 2 3; do
	redis_port=$(free_port) || fail "found no free port for redis-server"
	say "starting redis-server on 127.0.0.1:$redis_port (no persistence)"
	redis-server --bind 127.0.0.1 --port "$redis_port" --save '' --appendonly no \
		--dir "$tmp" --logfile '' >"$tmp/redis.log" 2>&1 &
	redis_pid=$!
	# Not a job of this shell any more, so that killing it with SIGKILL (the
	# outage) prints no "Killed" notice; stop() still signals it by pid.
	disown "$redis_pid"
	redis_up() { alive "$redis_pid" && redis_ping "$redis_port"; }
	for ((i = 0; i < 50; i++)); do
		redis_up && break
		alive "$redis_pid" || break
		sleep 0.2
	done
	redis_up && break
	stop "redis-server" "$redis_pid"
	redis_pid=
	say "redis-server did not come up (attempt $attempt)"
done
[[ -n $redis_pid ]] || fail "redis-server did not start"

# --- the example service ---------------------------------------------------
# raise: a storage error fails the request (503) instead of running the action
# unprotected. A short storage timeout keeps each failing request short.
# OPERATION_TTLS names the operation, so its series exist at zero from
# start-up, as docs/observability.md recommends for operations one alerts on.
# Every other IDEMPOTENCY_* variable of the caller's environment is removed,
# so that the run does not depend on it.
unset_env=()
for v in $(compgen -e); do
	[[ $v == IDEMPOTENCY_* ]] && unset_env+=(-u "$v")
done
say "starting examples/fxapp (IDEMPOTENCY_ON_STORAGE_ERROR=raise, IDEMPOTENCY_STORAGE_TIMEOUT=200ms)"
env ${unset_env[@]+"${unset_env[@]}"} \
	ADDR=127.0.0.1:0 \
	IDEMPOTENCY_REDIS_URL="redis://127.0.0.1:$redis_port/0" \
	IDEMPOTENCY_ON_STORAGE_ERROR=raise \
	IDEMPOTENCY_STORAGE_TIMEOUT=200ms \
	IDEMPOTENCY_OPERATION_TTLS="$OP:1h" \
	"$tmp/fxapp" >"$tmp/fxapp.log" 2>&1 &
app_pid=$!
app_url() {
	alive "$app_pid" || fail "fxapp exited"
	app=$(grep -o 'serving on http://[0-9.:]*' "$tmp/fxapp.log" 2>/dev/null | head -n 1 | cut -d' ' -f3) || true
	[[ -n $app ]]
}
until_ok "fxapp to serve" 30 app_url
grep -q 'redis is reachable' "$tmp/fxapp.log" || fail "fxapp did not report Redis reachable"
say "fxapp serves on $app"

# --- Prometheus --------------------------------------------------------------
# pay KEY: one payment; prints the status and, for a replay, " replayed".
pay() {
	local code h=$tmp/headers.$BASHPID
	code=$(curl -sS -o /dev/null -D "$h" -w '%{http_code}' --max-time 5 \
		-X POST "$app/payments" -H "Idempotency-Key: $1" -H 'X-Tenant: e2e' \
		-H 'Content-Type: application/json' \
		-d '{"account":"acc_e2e","amount":1999,"currency":"EUR"}' 2>/dev/null) || code=${code:-000}
	if grep -qi '^idempotent-replayed: *true' "$h" 2>/dev/null; then
		code+=" replayed"
	fi
	rm -f "$h"
	echo "$code"
}

cat >"$tmp/prometheus.yml" <<EOF
global:
  scrape_interval: 1s
  scrape_timeout: 1s
  evaluation_interval: 1s
rule_files:
  - $RULES
scrape_configs:
  - job_name: $JOB
    static_configs:
      - targets: ['${app#http://}']
EOF
if command -v promtool >/dev/null 2>&1; then
	say "promtool check config (and the rules it loads)"
	promtool check config "$tmp/prometheus.yml" >"$tmp/promtool.log" 2>&1 ||
		{ cat "$tmp/promtool.log" >&2; fail "promtool check config failed"; }
fi

prom_ready() {
	alive "$prom_pid" || return 1
	[[ $(curl -sS -o /dev/null -w '%{http_code}' --max-time 2 "$prom/-/ready" 2>/dev/null) == 200 ]]
}
for attempt in 1 2 3; do
	prom_port=$(free_port) || fail "found no free port for prometheus"
	prom=http://127.0.0.1:$prom_port
	say "starting prometheus on 127.0.0.1:$prom_port (scrape and evaluation every 1s, rules: ${RULES#"$root"/})"
	rm -rf "$tmp/tsdb"
	prometheus --config.file="$tmp/prometheus.yml" --storage.tsdb.path="$tmp/tsdb" \
		--web.listen-address="127.0.0.1:$prom_port" >"$tmp/prometheus.log" 2>&1 &
	prom_pid=$!
	end=$((SECONDS + 30))
	((end <= deadline)) || end=$deadline
	while alive "$prom_pid" && ! prom_ready && ((SECONDS < end)); do
		sleep 0.3
	done
	prom_ready && break
	if ! alive "$prom_pid" && grep -q 'address already in use' "$tmp/prometheus.log"; then
		say "port $prom_port was taken; retrying"
		wait "$prom_pid" 2>/dev/null || true
		prom_pid=
		continue
	fi
	fail "prometheus did not become ready"
done
[[ -n $prom_pid ]] || fail "prometheus did not start"

# query PROMQL: the JSON of an instant query; non-zero status when
# Prometheus does not answer or answers with an error (polls retry then).
query() {
	local out
	out=$(curl -sS --max-time 5 -G --data-urlencode "query=$1" "$prom/api/v1/query" 2>&1) || {
		echo "prometheus-e2e: query $1: $out" >&2
		return 1
	}
	jq -e '.status == "success"' <<<"$out" >/dev/null 2>&1 || {
		echo "prometheus-e2e: query $1: $out" >&2
		return 1
	}
	echo "$out"
}
# value PROMQL: the value of the query's only sample, "none" when it has no
# sample (or several), "error" when the query failed.
value() {
	local out
	out=$(query "$1") || {
		echo error
		return 0
	}
	jq -r 'if (.data.result | length) == 1 then .data.result[0].value[1] else "none" end' <<<"$out"
}
# api PATH: GET /api/v1/PATH, non-zero status when it fails.
api() {
	local out
	out=$(curl -sS --max-time 5 "$prom/api/v1/$1" 2>&1) &&
		jq -e '.status == "success"' <<<"$out" >/dev/null 2>&1 || {
		echo "prometheus-e2e: GET /api/v1/$1: $out" >&2
		return 1
	}
	echo "$out"
}

target_up() { [[ $(value "up{job=\"$JOB\"}") == 1 ]]; }
until_ok "Prometheus to scrape fxapp (up{job=\"$JOB\"} == 1)" 30 target_up
say "Prometheus scrapes fxapp: up{job=\"$JOB\"} == 1"

rules_evaluated() {
	local out
	out=$(api rules) || return 1
	jq -e '[.data.groups[].rules[]] | length > 0 and all(.health != "unknown")' <<<"$out" >/dev/null
}
until_ok "every rule of the rules file to be evaluated once" 20 rules_evaluated
rules_json=$(api rules) || fail "GET /api/v1/rules failed"
say "rules loaded: $(jq -r '[.data.groups[].rules[]] | "\(map(select(.type == "alerting")) | length) alerting and \(map(select(.type == "recording")) | length) recording rules"' <<<"$rules_json")"

# --- healthy traffic: misses and hits -----------------------------------------
say "sending $NKEYS payments with new keys, each followed by $NDUPS duplicates"
run_id=$(date +%s)-$$
for ((k = 1; k <= NKEYS; k++)); do
	key=e2e-$run_id-$k
	got=$(pay "$key")
	[[ $got == 201 ]] || fail "payment $key: got '$got', want 201"
	for ((d = 1; d <= NDUPS; d++)); do
		got=$(pay "$key")
		[[ $got == "201 replayed" ]] || fail "duplicate $d of $key: got '$got', want '201 replayed'"
	done
done

requests() { value "sum(idempotency_requests_total{job=\"$JOB\",operation=\"$OP\",outcome=\"$1\"})"; }
counts_seen() {
	[[ $(requests miss) == "$NKEYS" && $(requests hit) == "$((NKEYS * NDUPS))" ]]
}
until_ok "Prometheus to see $NKEYS misses and $((NKEYS * NDUPS)) hits" 20 counts_seen
say "Prometheus sees idempotency_requests_total{operation=\"$OP\"}: miss=$NKEYS hit=$((NKEYS * NDUPS)) in_flight=$(requests in_flight)"

families=$(query "count by (__name__) ({job=\"$JOB\",__name__=~\"idempotency_.*\"})") ||
	fail "listing the idempotency_* metrics failed"
families=$(jq -r '[.data.result[].metric.__name__] | sort | join(" ")' <<<"$families")
for f in idempotency_requests_total idempotency_errors_total idempotency_stored_total \
	idempotency_unprotected_total idempotency_wait_duration_seconds_bucket \
	idempotency_storage_duration_seconds_bucket idempotency_storage_duration_seconds_count; do
	[[ " $families " == *" $f "* ]] || fail "Prometheus has no series of $f; it has: $families"
done
labels=$(query "count by (outcome) (idempotency_requests_total{job=\"$JOB\",operation=\"$OP\"})") ||
	fail "listing the outcomes failed"
labels=$(jq -r '[.data.result[].metric.outcome] | sort | join(",")' <<<"$labels")
[[ $labels == hit,in_flight,miss,not_replayable ]] || fail "outcome labels of idempotency_requests_total: $labels, want hit,in_flight,miss,not_replayable"
stored=$(value "sum(idempotency_stored_total{job=\"$JOB\",operation=\"$OP\"})")
[[ $stored == "$NKEYS" ]] || fail "idempotency_stored_total{operation=\"$OP\"} = $stored, want $NKEYS"
ok_reserves=$(value "sum(idempotency_storage_duration_seconds_count{job=\"$JOB\",method=\"reserve\",result=\"ok\"})")
[[ $ok_reserves != none ]] && ((ok_reserves >= NKEYS * (NDUPS + 1))) ||
	fail "idempotency_storage_duration_seconds_count{method=\"reserve\",result=\"ok\"} = $ok_reserves, want >= $((NKEYS * (NDUPS + 1)))"
say "all six idempotency_* families present; stored=$stored, reserve calls ok=$ok_reserves"

# A recording rule of rules.yml on these series (its sum drops the job label): the replay ratio,
# hit / (hit + miss) = NDUPS / (NDUPS + 1), once a rule evaluation saw the
# scrape with all of them.
want_ratio=$(awk -v d="$NDUPS" 'BEGIN { printf "%.4f", d / (d + 1) }')
hit_ratio() { awk -v v="$(value "operation:idempotency_hit_ratio:rate5m{operation=\"$OP\"}")" -v w="$want_ratio" 'BEGIN { exit !(v + 0 > w - 0.001 && v + 0 < w + 0.001) }'; }
until_ok "operation:idempotency_hit_ratio:rate5m{operation=\"$OP\"} to be $want_ratio" 15 hit_ratio
say "recording rule operation:idempotency_hit_ratio:rate5m{operation=\"$OP\"} = $want_ratio"

# --- Redis outage, mode raise ---------------------------------------------
say "killing redis-server (SIGKILL) while payments continue, one every 0.2s"
stop "redis-server" "$redis_pid" KILL
redis_pid=
outage_started=$SECONDS
(
	trap 'exit 0' TERM
	n=0
	while :; do
		n=$((n + 1))
		pay "outage-$run_id-$n" >>"$tmp/outage.codes"
		sleep 0.2
	done
) &
traffic_pid=$!

got_503s() { [[ $(grep -c '^503$' "$tmp/outage.codes" 2>/dev/null) -ge 3 ]]; }
until_ok "three 503 responses during the outage" 20 got_503s
bad=$(grep -v '^503$' "$tmp/outage.codes" | sort | uniq -c | tr '\n' ' ') || true
[[ -z $bad ]] || fail "during the outage every payment must get 503 (raise mode); got: $bad"
say "payments during the outage get 503"

errors_seen() {
	local e s
	e=$(value "sum(idempotency_errors_total{job=\"$JOB\",operation=\"$OP\",error_type=\"storage_reserve_error\"})")
	s=$(value "sum(idempotency_storage_duration_seconds_count{job=\"$JOB\",method=\"reserve\",result=~\"error|timeout\"})")
	[[ $e != none && $s != none && $e != 0 && $s != 0 ]]
}
until_ok "Prometheus to see storage errors" 20 errors_seen
err_ratio() { awk -v v="$(value "method:idempotency_storage_errors:ratio_rate5m{method=\"reserve\"}")" 'BEGIN { exit !(v + 0 > 0) }'; }
until_ok "method:idempotency_storage_errors:ratio_rate5m{method=\"reserve\"} above 0" 15 err_ratio
say "Prometheus sees errors_total{error_type=\"storage_reserve_error\"}=$(value "sum(idempotency_errors_total{job=\"$JOB\",error_type=\"storage_reserve_error\"})"), storage_duration_seconds_count{method=\"reserve\",result=~\"error|timeout\"}=$(value "sum(idempotency_storage_duration_seconds_count{job=\"$JOB\",method=\"reserve\",result=~\"error|timeout\"})")"

# The storage-error alerts of rules.yml: the ratio of failed store calls by
# method, and the coordinator's storage_* errors by error type. Both have a
# `for:` (5m, 10m) longer than this run waits, so pending is enough; each
# must have its expression return a value.
read -r -a storage_alerts <<<"$STORAGE_ALERTS"
alerts_json=$(jq -c --args '[.data.groups[].rules[] | select(.type == "alerting")] as $all
	| [$ARGS.positional[] as $n | $all[] | select(.name == $n) | {name, query, duration}]' \
	"${storage_alerts[@]}" <<<"$rules_json")
for n in "${storage_alerts[@]}"; do
	jq -e --arg n "$n" 'any(.[]; .name == $n)' <<<"$alerts_json" >/dev/null ||
		fail "no alert $n in $RULES; its alerts: $(jq -r '[.data.groups[].rules[] | select(.type == "alerting") | .name] | join(" ")' <<<"$rules_json") (set PROM_E2E_STORAGE_ALERTS)"
done
say "storage-error alerts: $(jq -r '[.[] | "\(.name) (for: \(.duration)s)"] | join(", ")' <<<"$alerts_json")"

alert_state() { # NAME: "firing", "pending" or "inactive" ("error" if the API fails)
	local out
	out=$(api alerts) || {
		echo error
		return 0
	}
	jq -r --arg n "$1" <<<"$out" \
		'[.data.alerts[] | select(.labels.alertname == $n) | .state] | if index("firing") then "firing" elif index("pending") then "pending" else "inactive" end'
}
for ((a = 0; a < $(jq length <<<"$alerts_json"); a++)); do
	name=$(jq -r ".[$a].name" <<<"$alerts_json")
	expr=$(jq -r ".[$a].query" <<<"$alerts_json")
	active() {
		local s
		s=$(alert_state "$name")
		[[ $s == pending || $s == firing ]]
	}
	until_ok "alert $name to go pending or firing" 45 active
	state=$(alert_state "$name")
	result=$(query "$expr") || fail "the expression of $name failed: $expr"
	n=$(jq '.data.result | length' <<<"$result")
	((n > 0)) || fail "alert $name is $state but its expression returns nothing: $expr"
	say "alert $name is $state $((SECONDS - outage_started))s into the outage; its expression returns $n series: $(jq -c '[.data.result[] | .metric + {value: .value[1]}]' <<<"$result")"
done

# Raise mode: nothing ran without protection, so the unprotected-runs alert
# (if any) stays silent.
unprotected=$(value "sum(idempotency_unprotected_total{job=\"$JOB\"})")
[[ $unprotected == 0 ]] || fail "idempotency_unprotected_total = $unprotected in raise mode, want 0"
alerts_now=$(api alerts) || fail "GET /api/v1/alerts failed"
firing_unprotected=$(jq -r '[.data.alerts[] | select(.labels.alertname == "IdempotencyUnprotectedRuns") | .state] | unique | join(",")' <<<"$alerts_now")
[[ -z $firing_unprotected ]] || fail "IdempotencyUnprotectedRuns is $firing_unprotected although nothing ran unprotected"
say "idempotency_unprotected_total = 0 and IdempotencyUnprotectedRuns is inactive"

stop "traffic loop" "$traffic_pid"
traffic_pid=
say "$(grep -c . "$tmp/outage.codes") payments sent during the outage, all 503"

rules_json=$(api rules) || fail "GET /api/v1/rules failed"
errs=$(jq -r '[.data.groups[] | .name as $g | .rules[] | select(.health == "err") | "\($g)/\(.name): \(.lastError)"] | join("\n")' <<<"$rules_json")
[[ -z $errs ]] || fail "rules failed to evaluate: $errs"
say "every rule evaluated without error"

say "PASS in $((SECONDS - started))s"
