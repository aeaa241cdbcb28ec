#!/usr/bin/env bash
# sidecache avalanche benchmark: what clients see when many cached
# objects expire at the same moment under steady load, with and without
# stale serving. Everything runs on loopback, nothing is shared.
#
# Starts, on free loopback ports in a temp dir: its own redis-server and the
# example upstream with AV_DELAY_MS of latency per API request. Then, one
# system after the other, each on a cold cache:
#   nograce   AV_INSTANCES sidecache instances on that Redis, route ttl
#             AV_TTL, no grace (an expired object is refilled while its
#             readers wait for the lease holder)
#   grace     the same with `grace: AV_GRACE` (expired objects are served
#             STALE at once while one background refresh per object runs)
#   nginx     one nginx, proxy_cache_valid AV_TTL, proxy_cache_lock on,
#             proxy_cache_use_stale updating, proxy_cache_background_update on
# For each system:
#   1. prime: fetch all AV_OBJECTS objects once, 100 at a time, spread over
#      the instances; the time it takes is the spread of their expiry times
#   2. steady: AV_WARMUP seconds of unrecorded wrk (one per instance, Zipf
#      over the objects, bench/zipf.lua; fills the near caches), then
#      AV_STEADY recorded seconds while everything is fresh -> steady HIT p99
#   3. expiry: wrk again from 0.5 s before the first object expires until
#      1 s after the last (at least AV_WINDOW seconds) -> p99, max, non-2xx
#      answers, and origin requests
#      per object (the origin's /stats before the window and 1 s after it)
# p99 and max are the worst of the AV_INSTANCES wrk processes (they cannot be
# merged exactly). See bench/README.md ("Avalanche").
#
# Environment (defaults in brackets):
#   AV_OBJECTS [2000]        objects (even; two tenants)
#   AV_TTL [20]              seconds of freshness per object
#   AV_GRACE [30s]           grace of the `grace` system
#   AV_DELAY_MS [50]         origin latency per API request
#   AV_INSTANCES [3]         sidecache instances sharing one Redis
#   AV_CONNECTIONS [10]      wrk connections per instance (nginx gets as
#                            many wrk processes, all on its one port)
#   AV_WARMUP [2]            seconds of unrecorded load before the steady one
#   AV_STEADY [5]            seconds of the steady measurement
#   AV_WINDOW [3]            least seconds of the expiry measurement
#   AV_FILL_CONCURRENCY [64] sidecache fill.max_concurrency (priming runs 100
#                            fills at once over the instances)
#   AV_ROUNDS [1]            rounds (each system on a fresh namespace/cache)
#   AV_SYSTEMS ["nograce grace nginx"]
#   AV_SKIP_BUILD            set to use existing binaries instead of running cargo
#   SIDECACHE_BIN, UPSTREAM_BIN  binaries (default target/release/...)
#   SIDECACHE_LOG [warn]     sidecache's log level
#   AV_KEEP                  set to keep the temp dir (configs, logs)
set -euo pipefail
# The example origin runs in memory: a DATABASE_URL in the caller's shell
# would switch it to Postgres mode.
unset DATABASE_URL
prog=avalanche
# shellcheck source=bench/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
# No CPU pinning: a sidecar in a Pod is not pinned either.
on_servers=()

cd "$(dirname "${BASH_SOURCE[0]}")/.."
root=$(pwd)

objects=${AV_OBJECTS:-2000}
ttl=${AV_TTL:-20}
grace=${AV_GRACE:-30s}
delay=${AV_DELAY_MS:-50}
instances=${AV_INSTANCES:-3}
connections=${AV_CONNECTIONS:-10}
warmup=${AV_WARMUP:-2}
steady=${AV_STEADY:-5}
window=${AV_WINDOW:-3}
fill_concurrency=${AV_FILL_CONCURRENCY:-64}
rounds=${AV_ROUNDS:-1}
read -r -a systems <<<"${AV_SYSTEMS:-nograce grace nginx}"
sidecache_bin=${SIDECACHE_BIN:-$root/target/release/sidecache}
upstream_bin=${UPSTREAM_BIN:-$root/target/release/examples/upstream}

for v in OBJECTS:objects TTL:ttl DELAY_MS:delay INSTANCES:instances CONNECTIONS:connections \
    WARMUP:warmup STEADY:steady WINDOW:window FILL_CONCURRENCY:fill_concurrency ROUNDS:rounds; do
    name=${v#*:}
    value=${!name}
    [[ $value =~ ^[0-9]+$ && $value -gt 0 ]] || die "AV_${v%%:*} must be a positive integer (got '$value')"
done
((objects % 2 == 0)) || die "AV_OBJECTS must be even (two tenants)"
[[ $grace =~ ^[0-9]+(ms|s|m|h)$ ]] || die "AV_GRACE must be a duration like 30s (got '$grace')"
# Priming (about objects / 100 * delay) and the steady run must end before
# the first object expires.
min_ttl=$((objects * delay / 100 / 1000 + warmup + steady + 4))
((ttl >= min_ttl)) || die "AV_TTL must be at least $min_ttl s for these settings (priming + steady run)"
for s in "${systems[@]}"; do
    [[ $s == nograce || $s == grace || $s == nginx ]] ||
        die "unknown system '$s' in AV_SYSTEMS (known: nograce grace nginx)"
done
((${#systems[@]} > 0)) || die "AV_SYSTEMS is empty"
has() { local s; for s in "${systems[@]}"; do [[ $s == "$1" ]] && return 0; done; return 1; }

# ---------------------------------------------------------------- tools ----
nginx_bin=$(command -v nginx || echo /usr/sbin/nginx)
missing=()
has nginx && [[ ! -x $nginx_bin ]] && missing+=(nginx)
command -v wrk >/dev/null || missing+=(wrk)
command -v curl >/dev/null || missing+=(curl)
command -v redis-server >/dev/null && command -v redis-cli >/dev/null || missing+=(redis-server)
install_missing "${missing[@]}"
nginx_bin=$(command -v nginx || echo /usr/sbin/nginx)
# Descriptors for wrk and the servers.
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true

if [[ -z ${AV_SKIP_BUILD:-} ]]; then
    note "building release binaries"
    cargo build --release --locked --bin sidecache --example upstream
fi
[[ -x $upstream_bin ]] || die "no origin binary at $upstream_bin (cargo build --release --example upstream)"
[[ -x $sidecache_bin ]] || die "no sidecache binary at $sidecache_bin (cargo build --release --bin sidecache)"

# ------------------------------------------------------------ processes ----
work_dir avalanche AV_KEEP

# stop NAME: ends one process started with `start`.
stop() {
    kill "${pid_of[$1]}" 2>/dev/null || true
    wait "${pid_of[$1]}" 2>/dev/null || true
    unset "pid_of[$1]"
}

origin_port=$(free_port)
origin=http://127.0.0.1:$origin_port
start origin "$upstream_bin" --listen "127.0.0.1:$origin_port" --apps "$((objects / 2))" --delay-ms "$delay"
wait_until origin http_ok "$origin/healthz"

redis_port=$(free_port)
mkdir -p "$work/redis"
start redis redis-server --port "$redis_port" --bind 127.0.0.1 --save "" --appendonly no \
    --dir "$work/redis" --daemonize no
wait_until redis redis-cli -p "$redis_port" ping

# start_sidecaches SYSTEM ROUND: AV_INSTANCES instances in their own
# namespace (so every object starts cold); sets `bases` to their URLs.
start_sidecaches() {
    local system=$1 round=$2 i name proxy_port admin_port grace_line=''
    [[ $system == grace ]] && grace_line="grace: $grace"
    bases=()
    admins=()
    for ((i = 1; i <= instances; i++)); do
        name=$system-$round-$i
        proxy_port=$(free_port)
        admin_port=$(free_port)
        cat >"$work/$name.yaml" <<EOF
version: 1
listen: 127.0.0.1:$proxy_port
admin:
  listen: 127.0.0.1:$admin_port
upstream:
  url: $origin
  max_idle_per_host: 256
fill:
  max_concurrency: $fill_concurrency
store:
  redis:
    url: redis://127.0.0.1:$redis_port/0
  namespace: "av-$system-$round:"
routes:
  - name: app
    path: /api/tenants/{tenant}/apps/{id}
    params:
      tenant: "[A-Za-z0-9_-]{1,64}"
      id: "[1-9][0-9]{0,17}"
    ttl: ${ttl}s
    jitter: 0s
    $grace_line
EOF
        start "$name" env SIDECACHE_LOG="${SIDECACHE_LOG:-warn}" \
            "$sidecache_bin" run --config "$work/$name.yaml"
        wait_until "$name" http_ok "http://127.0.0.1:$admin_port/readyz"
        bases+=("http://127.0.0.1:$proxy_port")
        admins+=("http://127.0.0.1:$admin_port")
    done
}

# refresh_counts: background refreshes by outcome, summed over the
# instances' /metrics (e.g. "fetched=1936 busy=12").
refresh_counts() {
    local a
    for a in "${admins[@]}"; do
        curl -fsS --max-time 2 "$a/metrics" || die "no /metrics from $a"
    done | awk '/^sidecache_background_refresh_total\{/ {
            match($0, /outcome="[a-z_]*"/); o = substr($0, RSTART + 9, RLENGTH - 10); n[o] += $NF }
        END { s = ""; for (o in n) s = s sprintf("%s%s=%d", s == "" ? "" : " ", o, n[o]); print (s == "" ? "none" : s) }'
}

# start_nginx ROUND: one nginx on a fresh cache dir; sets `bases` to its URL
# once per instance (the load is spread the same way).
start_nginx() {
    local dir=$work/nginx-$1 port user_line='' i
    port=$(free_port)
    mkdir -p "$dir"
    # As root, nginx would switch its workers to `nobody`, who cannot enter
    # the temp dir; keep them as the invoking user instead.
    [[ $EUID -eq 0 ]] && user_line="user $(id -un) $(id -gn);"
    cat >"$dir/nginx.conf" <<EOF
$user_line
worker_processes auto;
worker_rlimit_nofile $(ulimit -n);
daemon off;
pid $dir/nginx.pid;
error_log $dir/error.log warn;
events { worker_connections 4096; }
http {
    access_log off;
    client_body_temp_path $dir/client_body;
    proxy_temp_path $dir/proxy;
    fastcgi_temp_path $dir/fastcgi;
    uwsgi_temp_path $dir/uwsgi;
    scgi_temp_path $dir/scgi;
    proxy_cache_path $dir/cache levels=1:2 keys_zone=av:10m max_size=200m inactive=2h use_temp_path=off;
    upstream origin {
        server 127.0.0.1:$origin_port;
        keepalive 256;
    }
    server {
        listen 127.0.0.1:$port;
        proxy_http_version 1.1;
        proxy_set_header Connection "";
        location ~ "^/api/tenants/[A-Za-z0-9_-]{1,64}/apps/[1-9][0-9]{0,17}\$" {
            proxy_pass http://origin;
            proxy_cache av;
            proxy_cache_valid 200 ${ttl}s;
            proxy_cache_lock on;
            proxy_cache_use_stale updating error timeout http_500 http_502 http_503 http_504;
            proxy_cache_background_update on;
            add_header X-Cache \$upstream_cache_status always;
        }
        location / { proxy_pass http://origin; }
    }
}
EOF
    "$nginx_bin" -t -q -p "$dir" -e "$dir/error.log" -c "$dir/nginx.conf" ||
        die "nginx rejected the generated config $dir/nginx.conf"
    start "nginx-$1" "$nginx_bin" -p "$dir" -e "$dir/error.log" -c "$dir/nginx.conf"
    wait_until "nginx-$1" http_ok "http://127.0.0.1:$port/healthz"
    bases=()
    admins=()
    for ((i = 1; i <= instances; i++)); do bases+=("http://127.0.0.1:$port"); done
}

# ------------------------------------------------------------- measuring ----
now_ms() { date +%s%3N; }
origin_count() {
    curl -fsS --max-time 2 "$origin/stats" | sed -n 's/.*"api_requests":\([0-9]*\).*/\1/p'
}

# object_path I: object I (1-based), as bench/zipf.lua builds it.
object_path() {
    local tenant=globex
    (($1 % 2 == 1)) && tenant=acme
    echo "/api/tenants/$tenant/apps/$((($1 + 1) / 2))"
}

# prime_list: a curl config that fetches every object once, object i
# through instance i mod AV_INSTANCES (written before the clock starts).
prime_list() {
    local i
    for ((i = 1; i <= objects; i++)); do
        printf 'url = "%s%s"\noutput = "/dev/null"\n' "${bases[$((i % instances))]}" "$(object_path "$i")"
    done >"$work/prime.curl"
}

# prime: runs that list, 100 at a time.
prime() {
    curl -sS --no-progress-meter --fail --parallel --parallel-max 100 --config "$work/prime.curl" ||
        die "priming failed: an object did not answer 200"
}

# load SECONDS TAG: one wrk per instance at once (Zipf over the objects);
# prints "requests non2xx socket_errors p99_us max_us" (p99 and max: worst
# wrk process).
load() {
    local secs=$1 tag=$2 i script=$work/wrk-zipf.lua pids=() line kv
    cat "$root/bench/zipf.lua" "$root/bench/report.lua" >"$script"
    for ((i = 0; i < instances; i++)); do
        BENCH_HOT_OBJECTS=$objects wrk -t 1 -c "$connections" -d "${secs}s" --timeout 5s \
            -s "$script" "${bases[$i]}/" >"$work/wrk-$tag-$i.log" 2>&1 &
        pids+=($!)
    done
    for i in "${!pids[@]}"; do
        wait "${pids[$i]}" || die "wrk failed (output: $work/wrk-$tag-$i.log)"
    done
    for ((i = 0; i < instances; i++)); do
        line=$(grep '^BENCH_RESULT ' "$work/wrk-$tag-$i.log") ||
            die "wrk printed no result (output: $work/wrk-$tag-$i.log)"
        echo "${line#BENCH_RESULT }"
    done | awk '{
        for (i = 1; i <= NF; i++) { split($i, kv, "="); r[kv[1]] = kv[2] }
        req += r["requests"]; bad += r["err_status"]
        sock += r["err_connect"] + r["err_read"] + r["err_write"] + r["err_timeout"]
        if (r["p99_us"] > p99) p99 = r["p99_us"]; if (r["max_us"] > mx) mx = r["max_us"]
    } END { printf "%d %d %d %d %d\n", req, bad, sock, p99, mx }'
}

results=$work/results.tsv
: >"$results"

# measure SYSTEM ROUND
measure() {
    local system=$1 round=$2 t0 t1 spread before after steady_r window_r wait_ms secs
    case $system in
    nginx) start_nginx "$round" ;;
    *) start_sidecaches "$system" "$round" ;;
    esac
    prime_list
    t0=$(now_ms)
    prime
    t1=$(now_ms)
    spread=$((t1 - t0))
    load "$warmup" "$system-$round-warmup" >/dev/null
    steady_r=$(load "$steady" "$system-$round-steady")
    # Wait for the first expiry minus 0.5 s: entries written at t0 or later
    # expire at t0 + ttl or later, and all of them by t1 + ttl. The window
    # runs until 1 s after that (at least AV_WINDOW seconds).
    wait_ms=$((t0 + ttl * 1000 - 500 - $(now_ms)))
    ((wait_ms > 0)) || die "$system: priming and the steady run took longer than the TTL; raise AV_TTL"
    secs=$(((spread + 1500 + 999) / 1000))
    ((secs < window)) && secs=$window
    sleep "$(awk -v ms="$wait_ms" 'BEGIN { printf "%.3f", ms / 1000 }')"
    before=$(origin_count)
    window_r=$(load "$secs" "$system-$round-window")
    sleep 1 # let refreshes the window started reach the origin's count
    after=$(origin_count)
    read -r sreq sbad ssock sp99 smax <<<"$steady_r"
    read -r wreq wbad wsock wp99 wmax <<<"$window_r"
    printf '%s\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\n' "$system" "$round" "$spread" \
        "$sreq" "$sbad" "$sp99" "$wreq" "$wbad" "$wsock" "$wp99" "$wmax" "$((after - before))" "$ssock" >>"$results"
    printf '  %-8s round %d: primed %d objects in %d ms; steady p99 %.2f ms; expiry window: %d requests, %d non-2xx, %d socket errors, p99 %.2f ms, max %.2f ms, origin requests %d (%.3f per object)\n' \
        "$system" "$round" "$objects" "$spread" "$(awk -v u="$sp99" 'BEGIN { print u / 1000 }')" \
        "$wreq" "$wbad" "$wsock" "$(awk -v u="$wp99" 'BEGIN { print u / 1000 }')" \
        "$(awk -v u="$wmax" 'BEGIN { print u / 1000 }')" "$((after - before))" \
        "$(awk -v n="$((after - before))" -v o="$objects" 'BEGIN { print n / o }')" >&2
    ((${#admins[@]} > 0)) && note "  $system round $round: background refreshes: $(refresh_counts)"
    if [[ $system == nginx ]]; then
        stop "nginx-$round"
    else
        for ((i = 1; i <= instances; i++)); do stop "$system-$round-$i"; done
    fi
}

note "${systems[*]}: $objects objects, ttl ${ttl}s, origin ${delay} ms, $instances instances x $connections connections;" \
    "~$((rounds * ${#systems[@]} * (ttl + window + 3) / 60 + 1)) min"
for ((round = 1; round <= rounds; round++)); do
    list=("${systems[@]}")
    if ((round % 2 == 0)); then # alternate the order so no system always goes first
        for ((i = 0, j = ${#list[@]} - 1; i < j; i++, j--)); do
            tmp=${list[i]} list[i]=${list[j]} list[j]=$tmp
        done
    fi
    for system in "${list[@]}"; do measure "$system" "$round"; done
done

# ------------------------------------------------------------- reporting ----
echo
printf '%-8s %10s %12s %12s %12s %9s %12s %14s\n' system 'prime ms' 'steady p99' 'expiry p99' 'expiry max' non-2xx 'p99 ratio' 'origin/object'
awk -F'\t' -v o="$objects" '
    { k = $1; if (!(k in n)) order[++m] = k; n[k]++
      if ($3 > spread[k]) spread[k] = $3; sp99[k] += $6; if ($10 > wp99[k]) wp99[k] = $10
      if ($11 > wmax[k]) wmax[k] = $11; bad[k] += $8 + $9; if ($12 / o > per[k]) per[k] = $12 / o
      ratio = $10 / $6; if (ratio > worst[k]) worst[k] = ratio }
    END { for (i = 1; i <= m; i++) { k = order[i]
            printf "%-8s %10d %9.2f ms %9.2f ms %9.2f ms %9d %11.2fx %14.3f\n", k, spread[k], sp99[k] / n[k] / 1000,
                   wp99[k] / 1000, wmax[k] / 1000, bad[k], worst[k], per[k] } }' "$results"
echo '(worst over rounds; p99 ratio = expiry-window p99 / the same round'"'"'s steady p99; non-2xx includes socket errors)'
echo
if grep -q '^grace' "$results"; then
    echo 'targets (grace)'
    awk -F'\t' -v o="$objects" '
        $1 == "grace" { bad += $8 + $9; if ($12 / o > per) per = $12 / o; r = $10 / $6; if (r > worst) worst = r }
        function check(name, ok, value) { printf "  %-44s %-7s %s\n", name, ok ? "met" : "MISSED", value }
        END {
            check("0 non-200 answers in the expiry window", bad == 0, bad)
            check("<= 1 origin request per object", per <= 1, sprintf("%.3f", per))
            check("expiry p99 <= 1.2x steady HIT p99", worst <= 1.2, sprintf("%.2fx", worst))
        }' "$results"
fi

mkdir -p "$root/bench/out"
out=$root/bench/out/avalanche-$(date -u +%Y%m%dT%H%M%SZ).json
{
    printf '{"git_commit": "%s", "loadavg": "%s", "objects": %d, "ttl_s": %d, "grace": "%s", "delay_ms": %d, "instances": %d, "connections_per_instance": %d, "runs": [\n' \
        "$(git rev-parse HEAD 2>/dev/null || echo unknown)" "$(cut -d' ' -f1-3 /proc/loadavg)" "$objects" "$ttl" "$grace" "$delay" "$instances" "$connections"
    awk -F'\t' '{ printf "%s  {\"system\": \"%s\", \"round\": %d, \"prime_ms\": %d, \"steady_requests\": %d, \"steady_non2xx\": %d, \"steady_p99_us\": %d, \"window_requests\": %d, \"window_non2xx\": %d, \"window_socket_errors\": %d, \"window_p99_us\": %d, \"window_max_us\": %d, \"window_origin_requests\": %d, \"steady_socket_errors\": %d}",
                  (NR > 1 ? ",\n" : ""), $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13 } END { print "" }' "$results"
    printf ']}\n'
} >"$out"
echo "raw numbers: $out"
