#!/usr/bin/env bash
# sidecache benchmark: one run, everything on loopback, nothing shared.
#
# Starts, on free loopback ports in a temp dir: its own redis-server, the
# example upstream as the origin, sidecache (Redis store) and nginx, all in
# front of the same origin. Then measures with wrk:
#   passthrough  GET of a path no cache rule covers: origin direct, nginx
#                proxy_pass, sidecache forwarding
#   hit          GET of one cached object: nginx proxy_cache, sidecache HIT
# Each measurement is preceded by an unrecorded warm-up; every system is
# measured BENCH_ROUNDS times, interleaved (round order alternates). Prints a
# table and writes the raw numbers to bench/out/<timestamp>.json.
# See bench/README.md for what is measured and how to read it.
#
# Environment (defaults in brackets):
#   BENCH_DURATION [10]      seconds per measurement
#   BENCH_WARMUP [3]         seconds of warm-up before each measurement
#   BENCH_ROUNDS [2]         measurements per system and scenario
#   BENCH_THREADS [1]        wrk threads
#   BENCH_CONNECTIONS [32]   wrk connections
#   BENCH_PAYLOAD_BYTES [1024]  size the origin pads each app document to
#   BENCH_SYSTEMS ["origin nginx sidecache"]  which systems to measure
#   BENCH_SIDECACHE_STORE [redis]  redis | embedded
#   BENCH_PIN [1]            pin servers and wrk to separate CPUs with taskset
#   BENCH_SERVER_CPUS [0]    CPUs for origin, redis, nginx, sidecache
#   BENCH_LOAD_CPUS [1]      CPUs for wrk
#   BENCH_SKIP_BUILD         set to use existing binaries instead of running cargo
#   SIDECACHE_BIN, UPSTREAM_BIN  binaries to run (default: target/release/...)
#   BENCH_KEEP               set to keep the temp dir (configs, logs)
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
root=$(pwd)

duration=${BENCH_DURATION:-10}
warmup=${BENCH_WARMUP:-3}
rounds=${BENCH_ROUNDS:-2}
threads=${BENCH_THREADS:-1}
connections=${BENCH_CONNECTIONS:-32}
payload=${BENCH_PAYLOAD_BYTES:-1024}
read -r -a systems <<<"${BENCH_SYSTEMS:-origin nginx sidecache}"
store=${BENCH_SIDECACHE_STORE:-redis}
pin=${BENCH_PIN:-1}
server_cpus=${BENCH_SERVER_CPUS:-0}
load_cpus=${BENCH_LOAD_CPUS:-1}

sidecache_bin=${SIDECACHE_BIN:-$root/target/release/sidecache}
upstream_bin=${UPSTREAM_BIN:-$root/target/release/examples/upstream}
passthrough_path='/api/tenants/acme/apps?limit=1'
hit_path='/api/tenants/acme/apps/1'

die() { printf 'bench: error: %s\n' "$*" >&2; exit 1; }
note() { printf 'bench: %s\n' "$*" >&2; }

for v in DURATION:duration WARMUP:warmup ROUNDS:rounds THREADS:threads CONNECTIONS:connections \
    PAYLOAD_BYTES:payload; do
    name=${v#*:}
    value=${!name}
    [[ $value =~ ^[0-9]+$ && $value -gt 0 ]] || die "BENCH_${v%%:*} must be a positive integer (got '$value')"
done
((connections >= threads)) || die "BENCH_CONNECTIONS must be at least BENCH_THREADS"
[[ $store == redis || $store == embedded ]] || die "BENCH_SIDECACHE_STORE must be redis or embedded"
has() { local s; for s in "${systems[@]}"; do [[ $s == "$1" ]] && return 0; done; return 1; }
for s in "${systems[@]}"; do
    [[ $s == origin || $s == nginx || $s == sidecache ]] ||
        die "unknown system '$s' in BENCH_SYSTEMS (known: origin nginx sidecache)"
done
((${#systems[@]} > 0)) || die "BENCH_SYSTEMS is empty"

# ---------------------------------------------------------------- tools ----
nginx_bin=$(command -v nginx || echo /usr/sbin/nginx)
need_redis=0
has sidecache && [[ $store == redis ]] && need_redis=1
missing=()
if has nginx && [[ ! -x $nginx_bin ]]; then
    missing+=(nginx)
fi
command -v wrk >/dev/null || missing+=(wrk)
command -v curl >/dev/null || missing+=(curl)
if ((need_redis)); then
    command -v redis-server >/dev/null && command -v redis-cli >/dev/null || missing+=(redis-server)
fi
if ((${#missing[@]} > 0)); then
    if [[ $EUID -eq 0 ]] && command -v apt-get >/dev/null; then
        note "installing ${missing[*]} with apt-get"
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
        nginx_bin=$(command -v nginx || echo /usr/sbin/nginx)
    else
        die "missing ${missing[*]}; install with: sudo apt-get install -y ${missing[*]}"
    fi
fi
if ((pin)); then
    command -v taskset >/dev/null || die "taskset not found (util-linux); or set BENCH_PIN=0"
    taskset -c "$server_cpus" true 2>/dev/null || die "cannot pin to BENCH_SERVER_CPUS=$server_cpus (this machine has $(nproc) CPUs); set BENCH_PIN=0 or other CPUs"
    taskset -c "$load_cpus" true 2>/dev/null || die "cannot pin to BENCH_LOAD_CPUS=$load_cpus (this machine has $(nproc) CPUs); set BENCH_PIN=0 or other CPUs"
    on_servers=(taskset -c "$server_cpus")
    on_load=(taskset -c "$load_cpus")
    # One worker per server CPU; tokio sizes its pool from the affinity mask.
    server_cpu_count=$(taskset -c "$server_cpus" nproc)
else
    on_servers=()
    on_load=()
    server_cpu_count=$(nproc)
fi

# ---------------------------------------------------------------- build ----
if [[ -z ${BENCH_SKIP_BUILD:-} ]]; then
    note "building release binaries"
    if has sidecache; then
        cargo build --release --locked --bin sidecache --example upstream
    else
        cargo build --release --locked --example upstream
    fi
fi
[[ -x $upstream_bin ]] || die "no origin binary at $upstream_bin (cargo build --release --example upstream)"
if has sidecache; then
    [[ -x $sidecache_bin ]] || die "no sidecache binary at $sidecache_bin (cargo build --release --bin sidecache)"
fi

# ------------------------------------------------------------ processes ----
work=$(mktemp -d "${TMPDIR:-/tmp}/sidecache-bench.XXXXXX")
declare -A pid_of=()
# shellcheck disable=SC2317 # invoked by the EXIT trap
cleanup() {
    local name
    for name in "${!pid_of[@]}"; do
        kill "${pid_of[$name]}" 2>/dev/null || true
    done
    for name in "${!pid_of[@]}"; do
        wait "${pid_of[$name]}" 2>/dev/null || true
    done
    if [[ -n ${BENCH_KEEP:-} ]]; then
        note "kept $work"
    else
        rm -rf "$work"
    fi
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

declare -A taken=()
# free_port: a loopback port nobody listens on and this run has not taken.
free_port() {
    local p i
    for ((i = 0; i < 200; i++)); do
        p=$((20000 + RANDOM % 30000))
        [[ -n ${taken[$p]:-} ]] && continue
        if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
            taken[$p]=1
            echo "$p"
            return
        fi
    done
    die "found no free loopback port"
}

# start NAME CMD...: runs CMD in the background on the server CPUs, logging
# to $work/NAME.log.
start() {
    local name=$1
    shift
    "${on_servers[@]}" "$@" >"$work/$name.log" 2>&1 &
    pid_of[$name]=$!
}

# alive NAME: fails with the tail of NAME's log if it has exited.
alive() {
    if ! kill -0 "${pid_of[$1]}" 2>/dev/null; then
        tail -n 20 "$work/$1.log" >&2 || true
        die "$1 exited (log: $work/$1.log, tail above)"
    fi
}

# wait_until NAME CMD...: retries CMD for up to 30 s while NAME is alive.
wait_until() {
    local name=$1 i
    shift
    for ((i = 0; i < 300; i++)); do
        alive "$name"
        "$@" >/dev/null 2>&1 && return 0
        sleep 0.1
    done
    tail -n 20 "$work/$name.log" >&2 || true
    die "$name did not become ready within 30 s (log: $work/$name.log)"
}

http_ok() { curl -fsS -o /dev/null --max-time 1 "$1"; }

origin_port=$(free_port)
origin=http://127.0.0.1:$origin_port
start origin "$upstream_bin" --listen "127.0.0.1:$origin_port" --apps 100 --payload-bytes "$payload"
wait_until origin http_ok "$origin/healthz"
declare -A base=([origin]=$origin)

if ((need_redis)); then
    redis_port=$(free_port)
    mkdir -p "$work/redis"
    start redis redis-server --port "$redis_port" --bind 127.0.0.1 --save "" --appendonly no \
        --dir "$work/redis" --daemonize no
    wait_until redis redis-cli -p "$redis_port" ping
fi

if has nginx; then
    nginx_port=$(free_port)
    mkdir -p "$work/nginx"
    user_line=''
    # As root, nginx would switch its workers to `nobody`, who cannot enter
    # the temp dir; keep them as the invoking user instead.
    [[ $EUID -eq 0 ]] && user_line="user $(id -un) $(id -gn);"
    sed -e "s|@USER_LINE@|$user_line|" -e "s|@WORKERS@|$server_cpu_count|" \
        -e "s|@DIR@|$work/nginx|g" -e "s|@PORT@|$nginx_port|" \
        -e "s|@ORIGIN_PORT@|$origin_port|" "$root/bench/nginx.conf.tmpl" >"$work/nginx/nginx.conf"
    "$nginx_bin" -t -q -p "$work/nginx" -e "$work/nginx/error.log" -c "$work/nginx/nginx.conf" ||
        die "nginx rejected the generated config $work/nginx/nginx.conf"
    start nginx "$nginx_bin" -p "$work/nginx" -e "$work/nginx/error.log" -c "$work/nginx/nginx.conf"
    base[nginx]=http://127.0.0.1:$nginx_port
    wait_until nginx http_ok "${base[nginx]}$passthrough_path"
fi

if has sidecache; then
    proxy_port=$(free_port)
    admin_port=$(free_port)
    if [[ $store == redis ]]; then
        store_yaml="store:
  redis:
    url: redis://127.0.0.1:$redis_port/0
  namespace: \"bench:\""
    else
        store_yaml="store:
  namespace: \"bench:\""
    fi
    cat >"$work/sidecache.yaml" <<EOF
version: 1
listen: 127.0.0.1:$proxy_port
admin:
  listen: 127.0.0.1:$admin_port
upstream:
  url: $origin
  max_idle_per_host: 64
$store_yaml
routes:
  - name: app
    path: /api/tenants/{tenant}/apps/{id}
    params:
      tenant: "[A-Za-z0-9_-]{1,64}"
      id: "[1-9][0-9]{0,17}"
    ttl: 60s
    negative_ttl: 5s
EOF
    start sidecache env SIDECACHE_LOG="${SIDECACHE_LOG:-warn}" \
        "$sidecache_bin" run --config "$work/sidecache.yaml"
    wait_until sidecache http_ok "http://127.0.0.1:$admin_port/readyz"
    base[sidecache]=http://127.0.0.1:$proxy_port
fi

# ------------------------------------------------------------ pre-checks ----
# expect_200 SYSTEM URL [XCACHE]: one request; fails unless it answers 200 (and,
# if given, with that X-Cache value).
expect_200() {
    local system=$1 url=$2 want=${3:-} code cache
    code=$(curl -sS -o /dev/null -D "$work/headers" -w '%{http_code}' --max-time 5 "$url") ||
        die "$system did not answer on $url"
    [[ $code == 200 ]] || die "$system answered $code on $url; the benchmark needs 200"
    if [[ -n $want ]]; then
        cache=$(awk -F': *' 'tolower($1) == "x-cache" { sub(/\r$/, "", $2); print $2 }' "$work/headers")
        [[ $cache == "$want" ]] ||
            die "$system answered X-Cache: '${cache:-(none)}' on $url after priming; expected $want"
    fi
}

scenarios=()
declare -A scenario_path=([passthrough]=$passthrough_path [hit]=$hit_path)
declare -A scenario_systems=()
pt=() hit=()
for s in "${systems[@]}"; do
    expect_200 "$s" "${base[$s]}$passthrough_path"
    pt+=("$s")
    if [[ $s != origin ]]; then
        expect_200 "$s" "${base[$s]}$hit_path"           # fill
        expect_200 "$s" "${base[$s]}$hit_path" HIT       # and now from the cache
        hit+=("$s")
    fi
done
scenarios+=(passthrough)
scenario_systems[passthrough]="${pt[*]}"
if ((${#hit[@]} > 0)); then
    scenarios+=(hit)
    scenario_systems[hit]="${hit[*]}"
fi

origin_count() {
    curl -fsS --max-time 2 "$origin/stats" | sed -n 's/.*"api_requests":\([0-9]*\).*/\1/p'
}

# ------------------------------------------------------------- measuring ----
results=$work/results.tsv
: >"$results"

# run_wrk SECONDS URL LOG: one wrk run on the load CPUs.
run_wrk() {
    "${on_load[@]}" wrk -t "$threads" -c "$connections" -d "${1}s" --timeout 5s \
        -s "$root/bench/report.lua" "$2" >"$3" 2>&1 ||
        die "wrk failed on $2 (output: $3)"
}

# measure SCENARIO SYSTEM ROUND: warm-up, then one recorded run.
measure() {
    local scenario=$1 system=$2 round=$3 url log before after line kv rps socket
    url=${base[$system]}${scenario_path[$scenario]}
    log=$work/wrk-$scenario-$system-$round.log
    alive "$system"
    run_wrk "$warmup" "$url" "$log.warmup"
    before=$(origin_count) || die "origin stopped answering /stats"
    run_wrk "$duration" "$url" "$log"
    after=$(origin_count) || die "origin stopped answering /stats"
    alive "$system"
    line=$(grep '^BENCH_RESULT ' "$log") || die "wrk printed no result for $url (output: $log)"
    declare -A r=()
    # shellcheck disable=SC2086 # split the key=value pairs on purpose
    for kv in ${line#BENCH_RESULT }; do
        r[${kv%%=*}]=${kv#*=}
    done
    ((r[requests] > 0)) || die "$system completed no request on $url during $scenario (output: $log)"
    ((r[err_status] == 0)) ||
        die "$system answered ${r[err_status]} non-2xx/3xx responses on $url during $scenario (output: $log)"
    socket=$((r[err_connect] + r[err_read] + r[err_write] + r[err_timeout]))
    ((socket == 0)) || note "warning: $system had $socket socket errors/timeouts during $scenario round $round"
    rps=$(awk -v n="${r[requests]}" -v us="${r[duration_us]}" 'BEGIN { printf "%.1f", n / (us / 1e6) }')
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$scenario" "$system" "$round" "$rps" \
        "${r[p50_us]}" "${r[p99_us]}" "${r[requests]}" "${r[bytes]}" "$socket" "$((after - before))" >>"$results"
    printf '  %-12s %-10s round %d: %10s req/s  p50 %6.2f ms  p99 %6.2f ms  origin requests %d\n' \
        "$scenario" "$system" "$round" "$rps" "$(awk -v u="${r[p50_us]}" 'BEGIN{print u/1000}')" \
        "$(awk -v u="${r[p99_us]}" 'BEGIN{print u/1000}')" "$((after - before))"
}

total=0
for scenario in "${scenarios[@]}"; do
    read -r -a list <<<"${scenario_systems[$scenario]}"
    total=$((total + ${#list[@]}))
done
note "$total measurements x $rounds rounds x $((warmup + duration)) s ~ $((total * rounds * (warmup + duration) / 60 + 1)) min;" \
    "wrk -t$threads -c$connections; pinning: $( ((pin)) && echo "servers on CPU $server_cpus, wrk on CPU $load_cpus" || echo off)"
for ((round = 1; round <= rounds; round++)); do
    echo "round $round/$rounds"
    for scenario in "${scenarios[@]}"; do
        read -r -a list <<<"${scenario_systems[$scenario]}"
        if ((round % 2 == 0)); then # alternate the order so no system always goes first
            for ((i = 0, j = ${#list[@]} - 1; i < j; i++, j--)); do
                tmp=${list[i]} list[i]=${list[j]} list[j]=$tmp
            done
        fi
        for system in "${list[@]}"; do
            measure "$scenario" "$system" "$round"
        done
    done
done

# ------------------------------------------------------------- reporting ----
# Per scenario and system: mean over rounds of req/s, p50 and p99, and the
# min/max req/s; then sidecache/nginx ratios.
summary=$work/summary.tsv
awk -F'\t' '
    { k = $1 "\t" $2; if (!(k in n)) order[++m] = k
      n[k]++; rps[k] += $4; p50[k] += $5; p99[k] += $6
      if (!(k in lo) || $4 < lo[k]) lo[k] = $4
      if (!(k in hi) || $4 > hi[k]) hi[k] = $4 }
    END { for (i = 1; i <= m; i++) { k = order[i]
            printf "%s\t%.1f\t%.1f\t%.1f\t%.1f\t%.1f\t%d\n", k, rps[k] / n[k], p50[k] / n[k], p99[k] / n[k], lo[k], hi[k], n[k] } }
' "$results" >"$summary"

echo
printf '%-12s %-10s %12s %20s %9s %9s\n' scenario system 'req/s' '(min..max)' 'p50 ms' 'p99 ms'
awk -F'\t' '{ printf "%-12s %-10s %12.0f %9.0f..%-9.0f %9.3f %9.3f\n", $1, $2, $3, $6, $7, $4 / 1000, $5 / 1000 }' "$summary"
echo
ratios=$(awk -F'\t' '
    { rps[$1, $2] = $3; p50[$1, $2] = $4; p99[$1, $2] = $5; sc[$1] = 1 }
    END { for (s in sc) if (((s, "sidecache") in rps) && ((s, "nginx") in rps))
            printf "%s\t%.3f\t%.3f\t%.3f\n", s, rps[s, "sidecache"] / rps[s, "nginx"],
                   p50[s, "sidecache"] / p50[s, "nginx"], p99[s, "sidecache"] / p99[s, "nginx"] }
' "$summary" | sort)
if [[ -n $ratios ]]; then
    echo 'sidecache / nginx (req/s above 1 = sidecache faster; latency below 1 = sidecache faster)'
    printf '%-12s %8s %8s %8s\n' scenario 'req/s' p50 p99
    awk -F'\t' '{ printf "%-12s %8.2f %8.2f %8.2f\n", $1, $2, $3, $4 }' <<<"$ratios"
fi

mkdir -p "$root/bench/out"
stamp=$(date -u +%Y%m%dT%H%M%SZ)
out=$root/bench/out/$stamp.json
json_str() { printf '"%s"' "$(printf '%s' "$1" | sed 's/\\/\\\\/g; s/"/\\"/g' | tr -d '\000-\037')"; }
{
    printf '{\n  "timestamp": %s,\n' "$(json_str "$stamp")"
    printf '  "git_commit": %s,\n' "$(json_str "$(git rev-parse HEAD 2>/dev/null || echo unknown)")"
    printf '  "host": {"cpus": %d, "cpu_model": %s, "kernel": %s},\n' "$(nproc)" \
        "$(json_str "$(awk -F': ' '/^model name/ { print $2; exit }' /proc/cpuinfo)")" "$(json_str "$(uname -r)")"
    printf '  "tools": {"wrk": %s, "nginx": %s, "redis": %s},\n' \
        "$(json_str "$(wrk -v 2>&1 | head -n 1 || true)")" \
        "$(json_str "$({ "$nginx_bin" -v 2>&1 || true; } | head -n 1)")" \
        "$(json_str "$({ redis-server --version 2>/dev/null || true; } | head -n 1)")"
    printf '  "settings": {"duration_s": %d, "warmup_s": %d, "rounds": %d, "threads": %d, "connections": %d, ' \
        "$duration" "$warmup" "$rounds" "$threads" "$connections"
    printf '"payload_bytes": %d, "sidecache_store": %s, "pinned": %s, "server_cpus": %s, "load_cpus": %s},\n' \
        "$payload" "$(json_str "$store")" "$( ((pin)) && echo true || echo false)" \
        "$(json_str "$server_cpus")" "$(json_str "$load_cpus")"
    printf '  "paths": {"passthrough": %s, "hit": %s},\n' "$(json_str "$passthrough_path")" "$(json_str "$hit_path")"
    printf '  "runs": [\n'
    awk -F'\t' '{ printf "%s    {\"scenario\": \"%s\", \"system\": \"%s\", \"round\": %d, \"rps\": %s, \"p50_us\": %s, \"p99_us\": %s, \"requests\": %s, \"bytes\": %s, \"socket_errors\": %s, \"origin_requests\": %s}",
                  (NR > 1 ? ",\n" : ""), $1, $2, $3, $4, $5, $6, $7, $8, $9, $10 } END { print "" }' "$results"
    printf '  ],\n  "summary": [\n'
    awk -F'\t' '{ printf "%s    {\"scenario\": \"%s\", \"system\": \"%s\", \"rps_mean\": %s, \"p50_us_mean\": %s, \"p99_us_mean\": %s, \"rps_min\": %s, \"rps_max\": %s, \"rounds\": %s}",
                  (NR > 1 ? ",\n" : ""), $1, $2, $3, $4, $5, $6, $7, $8 } END { print "" }' "$summary"
    printf '  ],\n  "sidecache_over_nginx": {'
    [[ -z $ratios ]] || awk -F'\t' '{ printf "%s\"%s\": {\"rps\": %s, \"p50\": %s, \"p99\": %s}", (NR > 1 ? ", " : ""), $1, $2, $3, $4 }' <<<"$ratios"
    printf '}\n}\n'
} >"$out"
echo
echo "raw numbers: $out"
