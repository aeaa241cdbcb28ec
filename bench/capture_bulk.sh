#!/usr/bin/env bash
# Change capture under a bulk change: one UPDATE touching
# BULK_ROWS mapped rows, in both capture modes. How long until every one of
# those objects is invalidated (target: 5 s), events per second, and what
# HITs on other objects see meanwhile (target: p99 within 2x). Everything
# runs on loopback, nothing is shared.
#
# Starts, on free loopback ports in a temp dir: its own redis-server, its
# own Postgres (initdb; wal_level=logical, track_commit_timestamp=on,
# pg_stat_statements; as root it runs as the `postgres` user via runuser)
# holding `app_config` (the example upstream's schema) with BULK_ROWS rows
# of tenant acme, and the example upstream in memory (serves the reads).
# sidecache connects as its own role `sidecache` (its statements apart in
# pg_stat_statements; auto_explain logs the plans of those slower than
# 100 ms). Then, per mode (BULK_MODES, default "triggers logical"):
#   1. the SQL of `sidecache capture-ddl` for the mode (triggers: outbox +
#      statement triggers; logical: publication + REPLICA IDENTITY FULL),
#      one sidecache (Redis store, near cache on, namespace of its own) with
#      `app_config` mapped to route `app` (params tenant/id from columns)
#   2. prime: every acme object 1..BULK_ROWS and BULK_HOT globex objects
#      are read through sidecache (cached; the globex ones checked to HIT);
#      then ten single-row UPDATEs, each applied before the next (a running
#      service's steady state: the feed's session has run its statements)
#   3. baseline: wrk -t1 -cBULK_CONNECTIONS for BULK_WINDOW s over the
#      globex objects (random, paced by BULK_DELAY_MS; bench/report.lua)
#      -> HIT p50/p99
#   4. burst ("reads"): the same wrk again; 2 s into it, psql runs
#      `UPDATE app_config SET version = version + 1 WHERE tenant = 'acme'`
#      (BULK_ROWS rows, one statement, one transaction). sidecache's
#      /metrics is polled every 50 ms until the capture path's own count
#      (`sidecache_invalidations_total{source="outbox"}` for triggers,
#      object and event kinds: the fan-out's rows are counted as `event` at
#      their claim; `{source="capture",kind="object"}` for logical) has
#      grown by BULK_ROWS
#   5. verify: a Lua SCAN over every `<ns>o:{app:acme:*}:g` key: each
#      generation's value starts with its creation time (Redis TIME,
#      seconds.micros); all BULK_ROWS must be later than the commit
#      (pg_xact_commit_timestamp of the UPDATE). The latest of them minus
#      the commit is the "all invalidated" time; the first and the median
#      (and the count per second) show where the time goes
#   6. ("quiet", BULK_QUIET) capture removed and installed again (triggers:
#      a new outbox table), sidecache restarted, the ten single-row
#      UPDATEs, and the same UPDATE with no reads running; 4-5 again
# Also recorded per burst: CPU seconds of sidecache, redis-server, the
# walsender and the other Postgres backends (/proc), Redis INFO
# commandstats, the top statements of pg_stat_statements, the outbox's
# autoanalyze time (triggers) and the slot's position (logical).
# See bench/README.md ("Change capture").
#
# Environment (defaults in brackets):
#   BULK_ROWS [100000]       rows the UPDATE touches (tenant acme, ids 1..N)
#   BULK_HOT [100]           globex objects read during the burst
#   BULK_CONNECTIONS [8]     wrk connections (one thread)
#   BULK_DELAY_MS [1]        pause of each wrk connection between its requests
#                            (0: closed loop, the machine saturated)
#   BULK_QUIET [1]           1: per mode, also the same UPDATE on a fresh
#                            install with no reads running
#   BULK_WINDOW [20]         seconds of each wrk run (baseline and burst)
#   BULK_MODES ["triggers logical"]
#   BULK_OUTBOX_BATCH        set to give triggers mode an explicit
#                            `invalidation.outbox` with this `batch`
#                            (default: the outbox defaults, batch 100)
#   BULK_ROLE_SETTINGS       Postgres settings for the role sidecache
#                            connects as, "name=value ..." (ALTER ROLE ...
#                            SET), e.g. "enable_sort=off": a workaround for
#                            the outbox claim's plan, see bench/README.md
#   BULK_PRIME [1]           0: do not cache the acme objects first (the
#                            invalidations then create the generations)
#   BULK_TIMEOUT [120]       seconds to wait for the invalidations
#   BULK_SKIP_BUILD          set to use existing binaries instead of running cargo
#   SIDECACHE_BIN, UPSTREAM_BIN  binaries (default target/release/...)
#   PG_BIN                   Postgres server binaries (default: newest
#                            /usr/lib/postgresql/*/bin)
#   SIDECACHE_LOG [info]     sidecache's log level (debug: per-batch lines)
#   BULK_KEEP                set to keep the temp dir (configs, logs)
set -euo pipefail
# The example origin runs in memory: a DATABASE_URL in the caller's shell
# would switch it to Postgres mode.
unset DATABASE_URL
prog=capture_bulk
# shellcheck source=bench/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
# No CPU pinning: a sidecar in a Pod is not pinned either.
on_servers=()

cd "$(dirname "${BASH_SOURCE[0]}")/.."
root=$(pwd)

rows=${BULK_ROWS:-100000}
hot=${BULK_HOT:-100}
connections=${BULK_CONNECTIONS:-8}
window=${BULK_WINDOW:-20}
timeout=${BULK_TIMEOUT:-120}
prime_all=${BULK_PRIME:-1}
outbox_batch=${BULK_OUTBOX_BATCH:-}
read -r -a role_settings <<<"${BULK_ROLE_SETTINGS:-}"
delay_ms=${BULK_DELAY_MS:-1}
quiet=${BULK_QUIET:-1}
read -r -a modes <<<"${BULK_MODES:-triggers logical}"
sidecache_bin=${SIDECACHE_BIN:-$root/target/release/sidecache}
upstream_bin=${UPSTREAM_BIN:-$root/target/release/examples/upstream}

for v in ROWS:rows HOT:hot CONNECTIONS:connections WINDOW:window TIMEOUT:timeout; do
    name=${v#*:}
    value=${!name}
    [[ $value =~ ^[0-9]+$ && $value -gt 0 ]] || die "BULK_${v%%:*} must be a positive integer (got '$value')"
done
((window >= 5)) || die "BULK_WINDOW must be at least 5 (the UPDATE starts 2 s into it)"
[[ $prime_all == 0 || $prime_all == 1 ]] || die "BULK_PRIME must be 0 or 1 (got '$prime_all')"
[[ $quiet == 0 || $quiet == 1 ]] || die "BULK_QUIET must be 0 or 1 (got '$quiet')"
[[ $delay_ms =~ ^[0-9]+$ ]] || die "BULK_DELAY_MS must be a whole number of milliseconds (got '$delay_ms')"
for kv in "${role_settings[@]}"; do
    [[ $kv =~ ^[a-z_.]+=[A-Za-z0-9_.]+$ ]] || die "BULK_ROLE_SETTINGS: '$kv' is not name=value"
done
[[ -z $outbox_batch || ($outbox_batch =~ ^[0-9]+$ && $outbox_batch -ge 1 && $outbox_batch -le 10000) ]] ||
    die "BULK_OUTBOX_BATCH must be between 1 and 10000 (got '$outbox_batch')"
((${#modes[@]} > 0)) || die "BULK_MODES is empty"
for m in "${modes[@]}"; do
    [[ $m == triggers || $m == logical ]] || die "unknown mode '$m' in BULK_MODES (known: triggers logical)"
done

# ---------------------------------------------------------------- tools ----
# shellcheck disable=SC2012 # version-sorted directory names
find_pg() { echo "${PG_BIN:-$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1 || true)}"; }
pg_bin=$(find_pg)
missing=()
command -v wrk >/dev/null || missing+=(wrk)
command -v curl >/dev/null || missing+=(curl)
command -v redis-server >/dev/null && command -v redis-cli >/dev/null || missing+=(redis-server)
command -v psql >/dev/null || missing+=(postgresql-client)
[[ -n $pg_bin && -x $pg_bin/initdb && -x $pg_bin/postgres ]] || missing+=(postgresql)
install_missing "${missing[@]}"
pg_bin=$(find_pg)
[[ -n $pg_bin && -x $pg_bin/initdb ]] || die "no Postgres server binaries (set PG_BIN)"
# Descriptors for wrk and the servers.
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true

if [[ -z ${BULK_SKIP_BUILD:-} ]]; then
    note "building release binaries"
    cargo build --release --locked --bin sidecache --example upstream
fi
[[ -x $upstream_bin ]] || die "no origin binary at $upstream_bin (cargo build --release --example upstream)"
[[ -x $sidecache_bin ]] || die "no sidecache binary at $sidecache_bin (cargo build --release --bin sidecache)"

# ------------------------------------------------------------ processes ----
work_dir capture_bulk BULK_KEEP
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

# Origin: in memory, tenants acme and globex with ids 1..rows.
origin_port=$(free_port)
start origin "$upstream_bin" --listen "127.0.0.1:$origin_port" --apps "$rows"
wait_until origin http_ok "http://127.0.0.1:$origin_port/healthz"

redis_port=$(free_port)
mkdir -p "$work/redis"
start redis redis-server --port "$redis_port" --bind 127.0.0.1 --save "" --appendonly no \
    --dir "$work/redis" --daemonize no
wait_until redis redis-cli -p "$redis_port" ping
rcli() { redis-cli -p "$redis_port" "$@"; }

pg_port=$(free_port)
pg_url="postgres://postgres@127.0.0.1:$pg_port/postgres"
# sidecache's own role: its statements apart in pg_stat_statements, and a
# place for per-role settings (BULK_ROLE_SETTINGS).
sc_url="postgres://sidecache@127.0.0.1:$pg_port/postgres"
mkdir -p "$work/pg"
[[ $EUID -eq 0 ]] && chown postgres:postgres "$work/pg"
"${as_pg[@]}" "$pg_bin/initdb" -U postgres -A trust -E UTF8 --locale=C --no-sync \
    -D "$work/pg/data" >"$work/initdb.log" 2>&1 || { cat "$work/initdb.log" >&2; die "initdb failed"; }
start postgres "${as_pg[@]}" "$pg_bin/postgres" -D "$work/pg/data" -p "$pg_port" -h 127.0.0.1 \
    -k "$work/pg" -c fsync=off -c wal_level=logical -c track_commit_timestamp=on \
    -c max_wal_size=4GB -c shared_preload_libraries=pg_stat_statements,auto_explain
# shellcheck disable=SC2120 # arguments come through wait_until
psql_do() { PGOPTIONS='-c client_min_messages=warning' psql -X -q -v ON_ERROR_STOP=1 "$pg_url" "$@"; }
psql_val() { psql_do -At -c "$1"; }
wait_until postgres psql_do -c 'SELECT 1'
postmaster=$(head -n 1 "$work/pg/data/postmaster.pid")
psql_do <<EOF
CREATE EXTENSION pg_stat_statements;
CREATE ROLE sidecache LOGIN SUPERUSER;
-- The plans of sidecache's slow statements go to the server log.
ALTER ROLE sidecache SET auto_explain.log_min_duration = '100ms';
CREATE TABLE app_config (
    tenant     text        NOT NULL,
    id         bigint      NOT NULL,
    name       text        NOT NULL,
    config     jsonb       NOT NULL,
    version    bigint      NOT NULL DEFAULT 1,
    updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant, id)
);
INSERT INTO app_config (tenant, id, name, config)
SELECT 'acme', g, 'app ' || g, '{"theme":"light","flags":{"beta":false}}' FROM generate_series(1, $rows) g;
VACUUM ANALYZE app_config;
EOF
for kv in "${role_settings[@]}"; do
    psql_do -c "ALTER ROLE sidecache SET ${kv%%=*} = '${kv#*=}'" >/dev/null
done

# ------------------------------------------------------------- sidecache ----
config() { # config MODE PROXY_PORT ADMIN_PORT
    local outbox=''
    if [[ $1 == triggers && -n $outbox_batch ]]; then
        outbox="  outbox:
    url: \"$sc_url\"
    batch: $outbox_batch"
    fi
    cat <<EOF
version: 1
listen: 127.0.0.1:$2
admin:
  listen: 127.0.0.1:$3
upstream:
  url: http://127.0.0.1:$origin_port
  max_idle_per_host: 256
fill:
  max_concurrency: 128
store:
  redis:
    url: redis://127.0.0.1:$redis_port/0
  namespace: "cb-$1:"
invalidation:
$outbox
  capture:
    mode: $1
    url: "$sc_url"
    tables:
      - table: public.app_config
        route: app
        params: { tenant: "{tenant}", id: "{id}" }
routes:
  - name: app
    path: /api/tenants/{tenant}/apps/{id}
    params:
      tenant: "[A-Za-z0-9_-]{1,64}"
      id: "[1-9][0-9]{0,17}"
    ttl: 1h
EOF
}

# metric NAME [LABEL...]: the sum of sidecache's /metrics samples of NAME
# carrying every LABEL (`source="outbox"`; in any order).
metric() {
    local name=$1
    shift
    curl -fsS --max-time 2 "$admin/metrics" |
        awk -v name="$name" -v labels="$*" '
            BEGIN { n = split(labels, want, " ") }
            index($0, name "{") == 1 || index($0, name " ") == 1 {
                for (i = 1; i <= n; i++) if (!index($0, want[i])) next
                sum += $NF }
            END { printf "%d\n", sum }'
}

# applied MODE: the capture path's own count of applied events.
applied() {
    case $1 in
    triggers) metric sidecache_invalidations_total 'source="outbox"' 'outcome="applied"' ;;
    logical) metric sidecache_invalidations_total 'source="capture"' 'outcome="applied"' 'kind="object"' ;;
    esac
}

grown() { (($(applied "$1") > $2)); } # grown MODE COUNT: applied more than COUNT
streaming() { [[ $(metric sidecache_capture_streaming) == 1 ]]; }

# xcache URL: the X-Cache header of one GET.
xcache() {
    curl -sS -o /dev/null -D - --max-time 5 "$1" |
        awk -F': *' 'tolower($1) == "x-cache" { sub(/\r$/, "", $2); print $2 }'
}

# prime FROM TO TENANT: reads every object of TENANT with ids FROM..TO
# through sidecache, 64 at a time.
prime() {
    local i
    for ((i = $1; i <= $2; i++)); do
        printf 'url = "%s/api/tenants/%s/apps/%d"\noutput = "/dev/null"\n' "$base" "$3" "$i"
    done >"$work/prime.curl"
    curl -sS --no-progress-meter --fail --parallel --parallel-max 64 --config "$work/prime.curl" ||
        die "priming failed: an object did not answer 200"
}

# The load: random GETs over the globex objects, with report.lua's line.
cat >"$work/hits.lua" <<EOF
local n = $hot
local requests = {}
init = function(args)
  for i = 1, n do
    requests[i] = wrk.format("GET", "/api/tenants/globex/apps/" .. i)
  end
  math.randomseed(7)
end
request = function()
  return requests[math.random(n)]
end
EOF
# Paced: each connection waits BULK_DELAY_MS between its requests (not
# counted in the latency), so the reads take part of the machine, not all.
if ((delay_ms > 0)); then
    printf 'delay = function()\n  return %d\nend\n' "$delay_ms" >>"$work/hits.lua"
fi
cat "$root/bench/report.lua" >>"$work/hits.lua"

# load TAG: one wrk run of BULK_WINDOW seconds (in the background: its pid
# in wrk_pid); load_result TAG prints "requests p50_us p99_us max_us errors".
load() {
    wrk -t 1 -c "$connections" -d "${window}s" --timeout 5s -s "$work/hits.lua" "$base/" \
        >"$work/wrk-$1.log" 2>&1 &
    wrk_pid=$!
}
load_result() {
    local line
    line=$(grep '^BENCH_RESULT ' "$work/wrk-$1.log") || die "wrk printed no result (output: $work/wrk-$1.log)"
    awk '{ for (i = 2; i <= NF; i++) { split($i, kv, "="); r[kv[1]] = kv[2] }
           printf "%d %d %d %d %d\n", r["requests"], r["p50_us"], r["p99_us"], r["max_us"],
                  r["err_connect"] + r["err_read"] + r["err_write"] + r["err_timeout"] + r["err_status"] }' <<<"$line"
}

# hit_counts: "HIT MISS" answers of route app so far.
hit_counts() {
    printf '%s %s\n' "$(metric sidecache_requests_total 'result="HIT"' 'route="app"')" \
        "$(metric sidecache_requests_total 'result="MISS"' 'route="app"')"
}

# cpu_ticks: "sidecache redis walsender backends exited" CPU ticks so far
# (utime + stime; `exited`: the postmaster's reaped children, e.g. psql's
# backend; `backends`: every other live child of the postmaster).
ticks_of() { awk '{ print $14 + $15 }' "/proc/$1/stat" 2>/dev/null || echo 0; }
cpu_ticks() {
    local pid cmd s w=0 b=0
    for pid in $(pgrep -P "$postmaster" || true); do
        s=$(ticks_of "$pid")
        cmd=$(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null || true)
        if [[ $cmd == *walsender* ]]; then w=$((w + s)); else b=$((b + s)); fi
    done
    printf '%d %d %d %d %d\n' "$(ticks_of "${pid_of[sidecache]}")" "$(ticks_of "${pid_of[redis]}")" "$w" "$b" \
        "$(awk '{ print $14 + $15 + $16 + $17 }' "/proc/$postmaster/stat")"
}

# commandstats: "cmd calls usec" per Redis command.
commandstats() {
    rcli INFO commandstats | tr -d '\r' |
        sed -nE 's/^cmdstat_([^:]+):calls=([0-9]+),usec=([0-9]+),.*/\1 \2 \3/p'
}

# gen_times NS: the creation time (seconds.micros) of every acme object's
# generation, one a line, read server-side by one script (SCAN + GET).
gen_times() {
    # shellcheck disable=SC2016 # Lua, not shell
    rcli EVAL '
        local out, cursor = {}, "0"
        repeat
          local r = redis.call("SCAN", cursor, "MATCH", ARGV[1], "COUNT", 1000)
          cursor = r[1]
          for _, k in ipairs(r[2]) do
            local v = redis.call("GET", k)
            if v then out[#out + 1] = string.match(v, "^[0-9]+%.[0-9]+") or "0" end
          end
        until cursor == "0"
        return out' 0 "$1o:{app:acme:*}:g"
}

results=$work/results.tsv
: >"$results"

# start_mode MODE: the SQL of `capture-ddl` for MODE, then one sidecache in
# namespace cb-MODE: (sets base, admin, ns), streaming if logical.
start_mode() {
    local mode=$1 proxy_port admin_port
    proxy_port=$(free_port)
    admin_port=$(free_port)
    base=http://127.0.0.1:$proxy_port
    admin=http://127.0.0.1:$admin_port
    ns=cb-$mode:
    config "$mode" "$proxy_port" "$admin_port" >"$work/$mode.yaml"
    "$sidecache_bin" capture-ddl --config "$work/$mode.yaml" >"$work/$mode.sql" || die "capture-ddl ($mode) failed"
    psql_do -f "$work/$mode.sql" >/dev/null
    start sidecache env SIDECACHE_LOG="${SIDECACHE_LOG:-info}" \
        "$sidecache_bin" run --config "$work/$mode.yaml"
    wait_until sidecache http_ok "$admin/readyz"
    if [[ $mode == logical ]]; then wait_until sidecache streaming; fi
}

# stop_mode MODE: stops sidecache and removes what capture-ddl installed
# (triggers mode: the outbox table too, so the next start is a fresh
# install again).
stop_mode() {
    stop sidecache
    if [[ $1 == triggers ]]; then
        "$sidecache_bin" capture-ddl --config "$work/$1.yaml" --drop | psql_do >/dev/null
        psql_do -c 'DROP TABLE sidecache_outbox' >/dev/null
    else
        psql_do -c "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots" \
            -c 'DROP PUBLICATION IF EXISTS sidecache' -c 'ALTER TABLE app_config REPLICA IDENTITY DEFAULT' >/dev/null
    fi
    psql_do -c 'VACUUM app_config' >/dev/null
}

# warm MODE: a running service writes now and then: ten single-row
# changes, each applied before the next, so the feed's session is in its
# steady state (the outbox worker's prepared statements have run more than
# five times: Postgres may use a cached generic plan for them from now on).
warm() {
    local i n0
    for ((i = 1; i <= 10; i++)); do
        n0=$(applied "$1")
        psql_do -c "UPDATE app_config SET version = version + 1 WHERE tenant = 'acme' AND id = $i" >/dev/null
        wait_until sidecache grown "$1" "$n0"
    done
}

# burst MODE RUN: the UPDATE of every acme row, with the read load running
# (RUN "reads": the load started 2 s before it, its figures and the
# baseline's in the result line) or without it (RUN "quiet"); waits until
# the capture path counts every row applied, then checks the generations.
# Appends one line to $results.
burst() {
    local mode=$1 run=$2 t_start deadline now n0 n c0 c1 h0 h1 burst_r=- stats commit gens done_ms='' wrk_end=0
    local keys after update_s first_s p50_s all_s polled_s covered cpu slow
    psql_do -c 'SELECT pg_stat_statements_reset()' >/dev/null
    rcli CONFIG RESETSTAT >/dev/null
    n0=$(applied "$mode")
    h0=$(hit_counts)
    c0=$(cpu_ticks)
    if [[ $run == reads ]]; then
        load "$mode-burst"
        wrk_end=$(($(date +%s%3N) + window * 1000))
        sleep 2
    fi
    # Logical, quiet: a second slot, read by nobody during the burst, to
    # time Postgres' own decoding of the transaction afterwards.
    if [[ $mode == logical && $run == quiet ]]; then
        psql_do -c "SELECT pg_create_logical_replication_slot('bench_peek', 'pgoutput')" >/dev/null
    fi
    t_start=$(date +%s%6N)
    psql_do -c "UPDATE app_config SET version = version + 1 WHERE tenant = 'acme'" ||
        die "[$mode] the UPDATE failed"
    deadline=$(($(date +%s%3N) + timeout * 1000))
    while :; do
        n=$(applied "$mode")
        now=$(date +%s%3N)
        if ((n - n0 >= rows)); then
            done_ms=$now
            break
        fi
        ((now < deadline)) || break
        alive sidecache
        sleep 0.05
    done
    c1=$(cpu_ticks)
    stats=$(commandstats)
    if [[ $run == reads ]]; then
        wait "$wrk_pid" || die "wrk failed (output: $work/wrk-$mode-burst.log)"
        burst_r=$(load_result "$mode-burst")
    fi
    h1=$(hit_counts)
    [[ -n $done_ms ]] || note "[$mode $run] WARNING: only $((n - n0)) of $rows applied within ${timeout}s"
    # The commit time of the UPDATE (track_commit_timestamp), in seconds.
    commit=$(psql_val "SELECT extract(epoch FROM pg_xact_commit_timestamp(xmin)) FROM app_config WHERE tenant = 'acme' AND id = 1")
    gens=$work/gens-$mode-$run.txt
    gen_times "$ns" >"$gens"
    # Times from the commit to the first, the median and the last
    # generation replaced (1 ms buckets), and to /metrics showing all.
    read -r keys after update_s first_s p50_s all_s polled_s covered < <(
        awk -v c="$commit" -v ts="$t_start" -v done_ms="${done_ms:-0}" -v wrk_end="$wrk_end" '
            $1 + 0 > c { d = $1 - c; b = int(d * 1000); h[b]++; m++; if (b > maxb) maxb = b }
            END {
                first = -1; p50 = -1
                for (b = 0; b <= maxb; b++) { if (h[b] && first < 0) first = b; acc += h[b]; if (p50 < 0 && acc >= m / 2) p50 = b }
                printf "%d %d %.3f %.3f %.3f %.3f %.3f %d\n", NR, m, c - ts / 1e6, first / 1000, p50 / 1000, maxb / 1000,
                    (done_ms > 0 ? done_ms / 1000 - c : -1), (wrk_end == 0 || wrk_end / 1000 > c + maxb / 1000) }' "$gens")
    ((keys == rows && after == rows)) ||
        note "[$mode $run] WARNING: $keys generation keys, $after of them created after the commit (expected $rows)"
    ((covered == 1)) || note "[$mode $run] WARNING: the burst outlasted the wrk window; its p99 covers only part of it"
    cpu=$(paste -d' ' <(tr ' ' '\n' <<<"$c0") <(tr ' ' '\n' <<<"$c1") | awk '{ printf "%.2f ", ($2 - $1) / 100 }')
    printf '%s\t%s\t%d\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$mode" "$run" "$keys" "$after" "$update_s" \
        "$first_s" "$p50_s" "$all_s" "$polled_s" "${base_r:--}" "$burst_r" "$h0 $h1" "$cpu" "$covered" >>"$results"
    {
        echo "== $mode ($run): Redis commandstats over the burst (calls, usec, usec/call)"
        awk '{ if ($2 > 0) printf "  %-24s %9d %10d %8.2f\n", $1, $2, $3, $3 / $2 }' <<<"$stats"
        echo "== $mode ($run): pg_stat_statements over the burst (calls | total ms | mean ms | rows | query; top 8 by total time)"
        psql_do -At -F ' | ' -c "SELECT calls, round(total_exec_time::numeric, 1) AS total_ms,
                round(mean_exec_time::numeric, 3) AS mean_ms, rows,
                left(regexp_replace(query, '\s+', ' ', 'g'), 110)
            FROM pg_stat_statements ORDER BY total_exec_time DESC LIMIT 8" | sed 's/^/  /'
        echo "== $mode ($run): generations replaced per second after the commit"
        awk -v c="$commit" '$1 > c { h[int($1 - c)]++; if (int($1 - c) > m) m = int($1 - c) }
            END { for (i = 0; i <= m; i++) printf "%s%d", (i ? " " : "  "), h[i]; print "" }' "$gens"
        slow=$(grep -c 'LOG:  duration: .* plan:' "$work/postgres.log" || true)
        echo "== $mode ($run): sidecache's statements slower than 100 ms so far (auto_explain): $slow; the last plan:"
        awk '/LOG:  duration: .* plan:/ { p = "" } /LOG:  duration: .* plan:|^\t/ { p = p $0 "\n" } END { printf "%s", p }' \
            "$work/postgres.log" | sed -n '1,12p' | cut -c1-150 | sed 's/^/  /'
        if [[ $mode == triggers ]]; then
            echo "== $mode ($run): outbox rows left: $(psql_val 'SELECT count(*) FROM sidecache_outbox')"
            echo "== $mode ($run): sidecache_outbox last autoanalyze / autovacuum, seconds after the commit: $(psql_val "SELECT
                coalesce(round((extract(epoch FROM last_autoanalyze) - $commit)::numeric, 2)::text, 'none') || ' / ' ||
                coalesce(round((extract(epoch FROM last_autovacuum) - $commit)::numeric, 2)::text, 'none')
                FROM pg_stat_user_tables WHERE relname = 'sidecache_outbox'")"
        else
            if [[ $run == quiet ]]; then
                echo "== $mode ($run): Postgres decoding the transaction alone (pgoutput to a SQL client, second slot): $(psql_val "
                    SELECT count(*) || ' messages in ' || round(extract(epoch FROM clock_timestamp() - statement_timestamp())::numeric, 3) || ' s'
                    FROM pg_logical_slot_get_binary_changes('bench_peek', NULL, NULL, 'proto_version', '1', 'publication_names', 'sidecache')")"
                psql_do -c "SELECT pg_drop_replication_slot('bench_peek')" >/dev/null
            fi
            echo "== $mode ($run): slot: $(psql_val "SELECT slot_name || ' confirmed ' || confirmed_flush_lsn || ' current ' || pg_current_wal_lsn() FROM pg_replication_slots")"
        fi
    } >"$work/detail-$mode-$run.txt"
    cat "$work/detail-$mode-$run.txt" >&2
}

run_mode() {
    local mode=$1 before h0 h1
    note "[$mode] setting up"
    start_mode "$mode"
    if [[ $prime_all == 1 ]]; then
        note "[$mode] priming $rows acme objects"
        before=$(date +%s%3N)
        prime 1 "$rows" acme
        note "[$mode] primed in $(($(date +%s%3N) - before)) ms"
    fi
    prime 1 "$hot" globex
    [[ $(xcache "$base/api/tenants/globex/apps/1") == HIT ]] || die "[$mode] a primed globex object does not HIT"
    warm "$mode"

    note "[$mode] baseline: ${window}s of HITs on $hot globex objects"
    h0=$(hit_counts)
    load "$mode-baseline"
    wait "$wrk_pid" || die "wrk failed (output: $work/wrk-$mode-baseline.log)"
    h1=$(hit_counts)
    base_r="$(load_result "$mode-baseline") $h0 $h1"

    note "[$mode] burst: UPDATE of $rows rows 2 s into ${window}s of HITs"
    burst "$mode" reads
    base_r=''
    stop_mode "$mode"
    if [[ $quiet == 1 ]]; then
        # The same on a fresh install, with no reads: what the capture path
        # does with the machine to itself.
        note "[$mode] quiet burst: the same UPDATE with no reads running"
        start_mode "$mode"
        warm "$mode"
        burst "$mode" quiet
        stop_mode "$mode"
    fi
}

for mode in "${modes[@]}"; do run_mode "$mode"; done

# ------------------------------------------------------------- reporting ----
echo
printf 'Bulk change: one UPDATE of %d mapped rows; HITs on %d other objects (wrk -t1 -c%d, %ss, %s)%s\n\n' \
    "$rows" "$hot" "$connections" "$window" "$([[ $delay_ms == 0 ]] && echo 'closed loop' || echo "${delay_ms} ms between a connection's requests")" \
    "${outbox_batch:+; invalidation.outbox.batch $outbox_batch}${role_settings[*]:+; role sidecache SET ${role_settings[*]}}"
printf '%-9s %-6s %9s %9s %9s %9s %10s %9s %13s %7s\n' mode run UPDATE 'first' median 'all' '(polled)' 'events/s' 'after commit' '<= 5 s'
awk -F'\t' -v rows="$rows" '{
    printf "%-9s %-6s %7.2f s %7.3f s %7.3f s %7.3f s %8.3f s %9.0f %6d/%-6d %7s\n", $1, $2, $5, $6, $7, $8, $9,
        ($8 > 0 ? rows / $8 : 0), $4, rows, ($4 == rows && $8 <= 5 ? "met" : "MISSED") }' "$results"
echo '(UPDATE: psql start to commit; first/median/all: commit to the first, median and last generation'
echo ' replaced, from the generations'"'"' own creation times; polled: commit to /metrics showing all applied)'
echo
printf '%-9s %-9s %9s %9s %9s %9s %9s %8s %8s %7s\n' mode run requests 'req/s' 'p50 ms' 'p99 ms' 'max ms' HIT MISS errors
awk -F'\t' -v w="$window" '$2 == "reads" {
    split($10, b, " "); split($11, u, " "); split($12, h, " ")
    printf "%-9s %-9s %9d %9.0f %9.2f %9.2f %9.2f %8d %8d %7d\n", $1, "baseline", b[1], b[1] / w, b[2] / 1000, b[3] / 1000, b[4] / 1000, b[8] - b[6], b[9] - b[7], b[5]
    printf "%-9s %-9s %9d %9.0f %9.2f %9.2f %9.2f %8d %8d %7d%s\n", $1, "burst", u[1], u[1] / w, u[2] / 1000, u[3] / 1000, u[4] / 1000, h[3] - h[1], h[4] - h[2], u[5], ($14 == 1 ? "" : "  (the burst outlasted the window)")
    printf "%-9s %-9s %9s %9s %8.2fx %8.2fx %8.2fx   p99 within 2x: %s\n", $1, "ratio", "", "", u[2] / b[2], u[3] / b[3], u[4] / b[4], (u[3] <= 2 * b[3] ? "met" : "MISSED") }' "$results"
echo
printf '%-9s %-6s %s\n' mode run 'CPU seconds, burst start to all applied: sidecache redis walsender pg-backends pg-exited'
awk -F'\t' '{ printf "%-9s %-6s %s\n", $1, $2, $13 }' "$results"
echo '(pg-exited: backends that ended meanwhile, mostly psql'"'"'s UPDATE; the reads run only in "reads")'

mkdir -p "$root/bench/out"
out=$root/bench/out/capture_bulk-$(date -u +%Y%m%dT%H%M%SZ).json
{
    printf '{"git_commit": "%s", "loadavg": "%s", "rows": %d, "hot": %d, "connections": %d, "delay_ms": %d, "window_s": %d, "outbox_batch": "%s", "role_settings": "%s", "primed": %d, "runs": [\n' \
        "$(git rev-parse HEAD 2>/dev/null || echo unknown)" "$(cut -d' ' -f1-3 /proc/loadavg)" "$rows" "$hot" \
        "$connections" "$delay_ms" "$window" "${outbox_batch:-default}" "${role_settings[*]}" "$prime_all"
    awk -F'\t' '{ split($10, b, " "); split($11, u, " ")
        printf "%s  {\"mode\": \"%s\", \"run\": \"%s\", \"generation_keys\": %d, \"created_after_commit\": %d, \"update_s\": %s, \"first_s\": %s, \"median_s\": %s, \"all_s\": %s, \"polled_s\": %s, \"cpu_s\": \"%s\"",
            (NR > 1 ? ",\n" : ""), $1, $2, $3, $4, $5, $6, $7, $8, $9, $13
        if ($2 == "reads") printf ", \"baseline\": {\"requests\": %d, \"p50_us\": %d, \"p99_us\": %d, \"max_us\": %d, \"errors\": %d}, \"burst\": {\"requests\": %d, \"p50_us\": %d, \"p99_us\": %d, \"max_us\": %d, \"errors\": %d}",
            b[1], b[2], b[3], b[4], b[5], u[1], u[2], u[3], u[4], u[5]
        printf "}" } END { print "" }' "$results"
    printf ']}\n'
} >"$out"
echo "raw numbers: $out"
