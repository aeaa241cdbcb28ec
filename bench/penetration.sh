#!/usr/bin/env bash
# sidecache penetration benchmark: how much of a flood of requests for ids
# that do not exist reaches the origin, with and without the Bloom filter (docs/bloom.md). Everything runs on loopback, nothing is shared.
#
# Starts, on free loopback ports in a temp dir: its own redis-server, its own
# Postgres (initdb; as root it runs as the `postgres` user via runuser)
# holding `app_config` with the N existing ids of tenant `acme` (and the
# outbox table from `sidecache outbox-ddl`), and the example upstream
# (in memory, the same ids 1..N, 404 for anything else). Then, one after
# the other, sidecache twice on the same Redis (separate namespaces):
#   bloom     the route has `bloom:` with `source` = that table; the filter
#             is built before the flood (admin rebuild) and checked
#   plain     the same config without `bloom:`
# and floods each with wrk (bench/penetration.lua: random ids from a huge
# range, so repeats are rare and the negative cache absorbs almost nothing)
# for the same duration and concurrency. The origin's `GET /stats`
# (`api_requests`) before and after gives origin requests per second; the
# reduction is plain / bloom. See bench/README.md ("Penetration").
#
# Environment (defaults in brackets):
#   PEN_DURATION [10]       seconds of flood per system
#   PEN_THREADS [1]         wrk threads
#   PEN_CONNECTIONS [32]    wrk connections
#   PEN_MEMBERS [10000]     existing ids (catalogue and filter capacity)
#   PEN_FP_RATE [0.01]      the filter's fp_rate
#   PEN_SKIP_BUILD          set to use existing binaries instead of running cargo
#   SIDECACHE_BIN, UPSTREAM_BIN  binaries (default target/release/...)
#   PG_BIN                  Postgres server binaries (default: newest
#                           /usr/lib/postgresql/*/bin)
#   SIDECACHE_LOG [warn]    sidecache's log level
#   PEN_KEEP                set to keep the temp dir (configs, logs)
set -euo pipefail
# The example origin runs in memory: a DATABASE_URL in the caller's shell
# would switch it to Postgres mode.
unset DATABASE_URL
prog=penetration
# shellcheck source=bench/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
# No CPU pinning here: processes start as they are.
on_servers=()

cd "$(dirname "${BASH_SOURCE[0]}")/.."
root=$(pwd)

duration=${PEN_DURATION:-10}
threads=${PEN_THREADS:-1}
connections=${PEN_CONNECTIONS:-32}
members=${PEN_MEMBERS:-10000}
fp_rate=${PEN_FP_RATE:-0.01}
sidecache_bin=${SIDECACHE_BIN:-$root/target/release/sidecache}
upstream_bin=${UPSTREAM_BIN:-$root/target/release/examples/upstream}
tenant=acme


for v in DURATION:duration THREADS:threads CONNECTIONS:connections MEMBERS:members; do
    name=${v#*:}
    value=${!name}
    [[ $value =~ ^[0-9]+$ && $value -gt 0 ]] || die "PEN_${v%%:*} must be a positive integer (got '$value')"
done
((connections >= threads)) || die "PEN_CONNECTIONS must be at least PEN_THREADS"
[[ $fp_rate =~ ^0?\.[0-9]+$ ]] || die "PEN_FP_RATE must be a fraction like 0.01 (got '$fp_rate')"

# ---------------------------------------------------------------- tools ----
# shellcheck disable=SC2012 # version-sorted directory names
pg_bin=${PG_BIN:-$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1 || true)}
missing=()
command -v wrk >/dev/null || missing+=(wrk)
command -v curl >/dev/null || missing+=(curl)
command -v redis-server >/dev/null && command -v redis-cli >/dev/null || missing+=(redis-server)
command -v psql >/dev/null || missing+=(postgresql-client)
[[ -n $pg_bin && -x $pg_bin/initdb && -x $pg_bin/postgres ]] || missing+=(postgresql)
install_missing "${missing[@]}"
# shellcheck disable=SC2012
pg_bin=${PG_BIN:-$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1 || true)}
[[ -n $pg_bin && -x $pg_bin/initdb ]] || die "no Postgres server binaries (set PG_BIN)"

# ---------------------------------------------------------------- build ----
if [[ -z ${PEN_SKIP_BUILD:-} ]]; then
    note "building release binaries"
    cargo build --release --locked --bin sidecache --example upstream
fi
[[ -x $upstream_bin ]] || die "no origin binary at $upstream_bin (cargo build --release --example upstream)"
[[ -x $sidecache_bin ]] || die "no sidecache binary at $sidecache_bin (cargo build --release --bin sidecache)"

# ------------------------------------------------------------ processes ----
work_dir penetration PEN_KEEP
chmod 755 "$work" # the postgres user must reach its data dir inside
as_pg=()
if [[ $EUID -eq 0 ]]; then
    id postgres >/dev/null 2>&1 || die "running as root needs a 'postgres' user to run Postgres as"
    as_pg=(runuser -u postgres --)
fi
# The postmaster (runuser may have forked it): fast shutdown by pid file.
# shellcheck disable=SC2317 # invoked by cleanup
extra_cleanup() { stop_postmaster "$work/pg/data"; }



# stop NAME: terminates NAME and waits for it.
stop() {
    kill "${pid_of[$1]}" 2>/dev/null || true
    wait "${pid_of[$1]}" 2>/dev/null || true
    unset "pid_of[$1]"
}




# Origin: in memory, tenants acme and globex with ids 1..members.
origin_port=$(free_port)
origin=http://127.0.0.1:$origin_port
start origin "$upstream_bin" --listen "127.0.0.1:$origin_port" --apps "$members"
wait_until origin http_ok "$origin/healthz"

redis_port=$(free_port)
mkdir -p "$work/redis"
start redis redis-server --port "$redis_port" --bind 127.0.0.1 --save "" --appendonly no \
    --dir "$work/redis" --daemonize no
wait_until redis redis-cli -p "$redis_port" ping

# Postgres: the membership source (same ids as the origin) and the outbox.
pg_port=$(free_port)
mkdir -p "$work/pg"
[[ $EUID -eq 0 ]] && chown postgres:postgres "$work/pg"
"${as_pg[@]}" "$pg_bin/initdb" -U postgres -A trust -E UTF8 --locale=C --no-sync \
    -D "$work/pg/data" >"$work/initdb.log" 2>&1 || { cat "$work/initdb.log" >&2; die "initdb failed"; }
start postgres "${as_pg[@]}" "$pg_bin/postgres" -D "$work/pg/data" -p "$pg_port" -h 127.0.0.1 \
    -k "$work/pg" -c fsync=off -c full_page_writes=off
pg_url="postgres://postgres@127.0.0.1:$pg_port/postgres"
# shellcheck disable=SC2120 # arguments come through wait_until
psql_do() { PGOPTIONS='-c client_min_messages=warning' psql -X -q -v ON_ERROR_STOP=1 "$pg_url" "$@"; }
wait_until postgres psql_do -c 'SELECT 1'
# shellcheck disable=SC2119
"$sidecache_bin" outbox-ddl | psql_do >/dev/null
# shellcheck disable=SC2119
psql_do <<EOF
CREATE TABLE app_config (tenant text NOT NULL, id bigint NOT NULL, PRIMARY KEY (tenant, id));
INSERT INTO app_config SELECT t, g FROM unnest(ARRAY['acme', 'globex']) t, generate_series(1, $members) g;
EOF

# ------------------------------------------------------------- sidecache ----
# config SYSTEM BLOOM_YAML: a sidecache config; both systems are identical
# except for the `bloom:` block and the key namespace.
config() {
    local system=$1 bloom=$2
    cat <<EOF
version: 1
listen: 127.0.0.1:$proxy_port
admin:
  listen: 127.0.0.1:$admin_port
upstream:
  url: $origin
  max_idle_per_host: 64
store:
  redis:
    url: redis://127.0.0.1:$redis_port/0
  namespace: "pen-$system:"
fill:
  # Above the flood's concurrency: no request is refused with 503 for want
  # of a fill slot, so every miss can reach the origin.
  max_concurrency: $((connections * 2))
invalidation:
  outbox:
    url: "$pg_url"
    poll_interval: 1s
routes:
  - name: app
    path: /api/tenants/{tenant}/apps/{id}
    params:
      tenant: "[A-Za-z0-9_-]{1,64}"
      id: "[1-9][0-9]{0,17}"
    ttl: 60s
    negative_ttl: 5s
$bloom
EOF
}

bloom_yaml="    bloom:
      scope: \"{tenant}\"
      source: \"SELECT id::text FROM app_config WHERE tenant = \$1\"
      capacity: $members
      fp_rate: $fp_rate
      rebuild_every: 10m"

origin_count() {
    curl -fsS --max-time 2 "$origin/stats" | sed -n 's/.*"api_requests":\([0-9]*\).*/\1/p'
}

# xcache URL: "<status> <X-Cache>" of one GET.
xcache() {
    curl -sS -o /dev/null -D "$work/headers" -w '%{http_code}' --max-time 5 "$1" >"$work/code" ||
        die "no answer from $1"
    printf '%s %s' "$(cat "$work/code")" \
        "$(awk -F': *' 'tolower($1) == "x-cache" { sub(/\r$/, "", $2); print $2 }' "$work/headers")"
}

# metric SAMPLE: a sample's value from sidecache's /metrics (0 if absent).
metric() {
    curl -fsS --max-time 2 "http://127.0.0.1:$admin_port/metrics" |
        awk -v s="$1" 'index($0, s " ") == 1 { print $NF; found = 1 } END { if (!found) print 0 }'
}

declare -A origin_rps=() client_rps=() origin_calls=() sent=() bloom_answers=() miss_answers=()
for system in bloom plain; do
    proxy_port=$(free_port)
    admin_port=$(free_port)
    if [[ $system == bloom ]]; then
        config "$system" "$bloom_yaml" >"$work/$system.yaml"
    else
        config "$system" "" >"$work/$system.yaml"
    fi
    start "sidecache-$system" env SIDECACHE_LOG="${SIDECACHE_LOG:-warn}" \
        "$sidecache_bin" run --config "$work/$system.yaml"
    wait_until "sidecache-$system" http_ok "http://127.0.0.1:$admin_port/readyz"
    base=http://127.0.0.1:$proxy_port

    if [[ $system == bloom ]]; then
        # Build now (the first request would also start it, lazily).
        curl -fsS --max-time 120 -X POST \
            "http://127.0.0.1:$admin_port/admin/bloom/app/rebuild?scope=$tenant" >"$work/rebuild.json" ||
            die "bloom rebuild failed: $(cat "$work/rebuild.json" 2>/dev/null)"
        grep -q '"outcome":"activated"' "$work/rebuild.json" ||
            die "bloom rebuild did not activate: $(cat "$work/rebuild.json")"
        note "filter built: $(cat "$work/rebuild.json")"
        got=$(xcache "$base/api/tenants/$tenant/apps/99999999999999")
        [[ $got == "404 BLOOM" ]] || die "bloom: an absent id answered '$got', expected '404 BLOOM'"
    else
        got=$(xcache "$base/api/tenants/$tenant/apps/99999999999999")
        [[ $got == "404 MISS" ]] || die "plain: an absent id answered '$got', expected '404 MISS'"
    fi
    got=$(xcache "$base/api/tenants/$tenant/apps/$members")
    [[ $got == "200 MISS" ]] || die "$system: an existing id answered '$got', expected '200 MISS'"

    note "flooding $system with absent ids: ${duration}s, $connections connections, $threads threads"
    before=$(origin_count)
    PEN_TENANT=$tenant wrk -t "$threads" -c "$connections" -d "${duration}s" --timeout 5s \
        -s "$root/bench/penetration.lua" "$base" >"$work/wrk-$system.log" 2>&1 ||
        die "wrk failed against $system (output: $work/wrk-$system.log)"
    after=$(origin_count)
    alive "sidecache-$system"
    line=$(grep '^PEN_RESULT ' "$work/wrk-$system.log") || die "wrk printed no result (output: $work/wrk-$system.log)"
    requests=$(sed -n 's/.* requests=\([0-9]*\).*/\1/p' <<<"$line")
    duration_us=$(sed -n 's/.* duration_us=\([0-9]*\).*/\1/p' <<<"$line")
    errors=$(sed -n 's/.*err_connect=\([0-9]*\) err_read=\([0-9]*\) err_write=\([0-9]*\) err_timeout=\([0-9]*\).*/\1+\2+\3+\4/p' <<<"$line")
    ((errors == 0)) || note "warning: $system: socket errors ($line)"
    sent[$system]=$requests
    origin_calls[$system]=$((after - before))
    client_rps[$system]=$(awk -v n="$requests" -v us="$duration_us" 'BEGIN { printf "%.0f", n / (us / 1e6) }')
    origin_rps[$system]=$(awk -v n="${origin_calls[$system]}" -v us="$duration_us" 'BEGIN { printf "%.1f", n / (us / 1e6) }')
    bloom_answers[$system]=$(metric 'sidecache_requests_total{result="BLOOM",route="app"}')
    miss_answers[$system]=$(metric 'sidecache_requests_total{result="MISS",route="app"}')
    stop "sidecache-$system"
done

# --------------------------------------------------------------- report ----
ratio=$(awk -v a="${origin_rps[plain]}" -v b="${origin_rps[bloom]}" \
    'BEGIN { if (b > 0) printf "%.1f", a / b; else print "inf" }')
# share: origin requests per flood request (independent of the client rate).
share() { awk -v o="${origin_calls[$1]}" -v n="${sent[$1]}" 'BEGIN { if (n > 0) printf "%.4f", o / n; else print 0 }'; }
pass_rate=$(share bloom)
plain_share=$(share plain)
share_ratio=$(awk -v a="$plain_share" -v b="$pass_rate" 'BEGIN { if (b > 0) printf "%.1f", a / b; else print "inf" }')
printf '\nPenetration: %ss flood of random absent ids, %s connections, %s threads; %s existing ids, fp_rate %s\n\n' \
    "$duration" "$connections" "$threads" "$members" "$fp_rate"
printf '%-8s %12s %12s %14s %14s %12s %12s\n' system requests client_rps origin_requests origin_rps BLOOM MISS
for system in bloom plain; do
    printf '%-8s %12s %12s %14s %14s %12s %12s\n' "$system" "${sent[$system]}" "${client_rps[$system]}" \
        "${origin_calls[$system]}" "${origin_rps[$system]}" "${bloom_answers[$system]}" "${miss_answers[$system]}"
done
printf '\norigin requests/s without the filter / with it: %s\n' "$ratio"
printf 'share of the flood that reached the origin: %s without, %s with the filter (%sx fewer per request)\n' \
    "$plain_share" "$pass_rate" "$share_ratio"

mkdir -p "$root/bench/out"
out=$root/bench/out/penetration-$(date -u +%Y%m%dT%H%M%SZ).json
cat >"$out" <<EOF
{"timestamp": "$(date -u +%Y-%m-%dT%H:%M:%SZ)", "git_commit": "$(git rev-parse --short HEAD 2>/dev/null || echo unknown)",
 "settings": {"duration_s": $duration, "threads": $threads, "connections": $connections, "members": $members, "fp_rate": $fp_rate},
 "bloom": {"requests": ${sent[bloom]}, "client_rps": ${client_rps[bloom]}, "origin_requests": ${origin_calls[bloom]}, "origin_rps": ${origin_rps[bloom]}, "bloom_answers": ${bloom_answers[bloom]}, "miss_answers": ${miss_answers[bloom]}},
 "plain": {"requests": ${sent[plain]}, "client_rps": ${client_rps[plain]}, "origin_requests": ${origin_calls[plain]}, "origin_rps": ${origin_rps[plain]}, "bloom_answers": ${bloom_answers[plain]}, "miss_answers": ${miss_answers[plain]}},
 "origin_rps_reduction": "$ratio", "bloom_pass_rate": "$pass_rate", "plain_pass_rate": "$plain_share",
 "per_request_reduction": "$share_ratio"}
EOF
note "raw numbers: $out"
