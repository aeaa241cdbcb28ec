#!/usr/bin/env bash
# The access log's cost on the hot path: HIT req/s of one sidecache with the
# access log on vs off, in one run, on one process (turned on and off by
# reloading its config), alternating off/on BENCH_ROUNDS times so that drift
# in the machine's load hits both sides alike. The log is JSON, every
# request (sample 1), written to a file in the temp dir. Prints each pair
# and the ratio on/off of the means; the target is >= 0.95.
#
# Same layout as bench/run.sh (origin, redis, sidecache with the near cache;
# servers pinned to BENCH_SERVER_CPUS, wrk to BENCH_LOAD_CPUS).
#
# Environment (defaults in brackets): BENCH_DURATION [10] s per measurement,
# BENCH_WARMUP [3], BENCH_ROUNDS [4] pairs, BENCH_CONNECTIONS [32],
# BENCH_PIN [1], BENCH_SERVER_CPUS [0], BENCH_LOAD_CPUS [1],
# BENCH_SKIP_BUILD, SIDECACHE_BIN, UPSTREAM_BIN, BENCH_KEEP.
set -euo pipefail
unset DATABASE_URL
prog=bench-access-log
# shellcheck source=bench/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$(dirname "${BASH_SOURCE[0]}")/.."
root=$(pwd)

duration=${BENCH_DURATION:-10}
warmup=${BENCH_WARMUP:-3}
rounds=${BENCH_ROUNDS:-4}
connections=${BENCH_CONNECTIONS:-32}
sidecache_bin=${SIDECACHE_BIN:-$root/target/release/sidecache}
upstream_bin=${UPSTREAM_BIN:-$root/target/release/examples/upstream}
hit_path='/api/tenants/acme/apps/1'

for tool in wrk curl redis-server redis-cli; do
    command -v "$tool" >/dev/null || die "$tool not found (bench/run.sh installs it)"
done
if [[ ${BENCH_PIN:-1} == 1 ]]; then
    on_servers=(taskset -c "${BENCH_SERVER_CPUS:-0}")
    on_load=(taskset -c "${BENCH_LOAD_CPUS:-1}")
else
    on_servers=()
    on_load=()
fi
if [[ -z ${BENCH_SKIP_BUILD:-} ]]; then
    note "building release binaries"
    cargo build --release --locked --bin sidecache --example upstream
fi

work_dir bench-log

origin_port=$(free_port)
start origin "$upstream_bin" --listen "127.0.0.1:$origin_port" --apps 100 --payload-bytes 1024
wait_until origin http_ok "http://127.0.0.1:$origin_port/healthz"
redis_port=$(free_port)
mkdir -p "$work/redis"
start redis redis-server --port "$redis_port" --bind 127.0.0.1 --save "" --appendonly no \
    --dir "$work/redis" --daemonize no
wait_until redis redis-cli -p "$redis_port" ping

proxy_port=$(free_port)
admin_port=$(free_port)
admin=http://127.0.0.1:$admin_port
mkdir -p "$work/config"
# config ENABLED: writes the config with the access log on or off.
config() {
    cat >"$work/config/sidecache.yaml.tmp" <<EOF
version: 1
listen: 127.0.0.1:$proxy_port
admin: { listen: 127.0.0.1:$admin_port }
upstream: { url: "http://127.0.0.1:$origin_port" }
store:
  redis: { url: "redis://127.0.0.1:$redis_port/0" }
access_log: { enabled: $1, format: json }
routes:
  - name: app
    path: /api/tenants/{tenant}/apps/{id}
    params: { tenant: "[A-Za-z0-9_-]{1,64}", id: "[1-9][0-9]{0,17}" }
    ttl: 1h
EOF
    mv "$work/config/sidecache.yaml.tmp" "$work/config/sidecache.yaml"
}
config false
"${on_servers[@]}" env SIDECACHE_LOG=warn "$sidecache_bin" run --config "$work/config/sidecache.yaml" \
    >"$work/access.log" 2>"$work/sidecache.log" &
pid_of[sidecache]=$!
wait_until sidecache http_ok "$admin/readyz"
url=http://127.0.0.1:$proxy_port$hit_path
curl -fsS -o /dev/null "$url" || die "sidecache did not answer $url"

applied() {
    curl -fsS "$admin/metrics" | awk '/^sidecache_config_reloads_total\{outcome="applied"\}/ { print $2 }'
}
# set_log ENABLED: reloads with the log on or off and waits until applied.
log_now=false
set_log() {
    local before i
    [[ $1 == "$log_now" ]] && return 0
    log_now=$1
    before=$(applied)
    before=${before:-0}
    config "$1"
    kill -HUP "${pid_of[sidecache]}"
    for ((i = 0; i < 100; i++)); do
        [[ $(applied) != "$before" && -n $(applied) ]] && return 0
        sleep 0.1
    done
    die "reload to access_log.enabled=$1 not applied"
}

# rps: one warm-up, then one measured wrk run; prints req/s.
rps() {
    "${on_load[@]}" wrk -t 1 -c "$connections" -d "${warmup}s" "$url" >/dev/null
    "${on_load[@]}" wrk -t 1 -c "$connections" -d "${duration}s" "$url" |
        awk '/^Requests\/sec:/ { print $2 }'
}

declare -a off=() on=()
for ((r = 1; r <= rounds; r++)); do
    # Alternate which side goes first, so a trend favours neither.
    for side in $( ((r % 2)) && echo "false true" || echo "true false"); do
        set_log "$side"
        value=$(rps)
        if [[ $side == true ]]; then on+=("$value"); else off+=("$value"); fi
        note "round $r log $side: $value req/s"
    done
done
lines=$(wc -l <"$work/access.log")
dropped=$(curl -fsS "$admin/metrics" | awk '/^sidecache_access_log_dropped_total/ { s += $2 } END { print s + 0 }')
awk -v on="${on[*]}" -v off="${off[*]}" -v lines="$lines" -v dropped="$dropped" 'BEGIN {
    n = split(on, a, " "); split(off, b, " ")
    for (i = 1; i <= n; i++) { son += a[i]; soff += b[i]; printf "round %d  off %10.1f  on %10.1f  on/off %.3f\n", i, b[i], a[i], a[i] / b[i] }
    printf "mean    off %10.1f  on %10.1f  on/off %.3f (target >= 0.95)\n", soff / n, son / n, son / soff
    printf "lines written %d, dropped %d\n", lines, dropped
}'
