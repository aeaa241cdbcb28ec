#!/usr/bin/env bash
# Change capture's cost on the service's own writes: pgbench updating one row of a mapped table, with and without capture.
# Everything runs on loopback, nothing is shared.
#
# Starts, on free loopback ports in a temp dir: its own redis-server and its
# own Postgres (initdb; as root it runs as the `postgres` user via runuser)
# holding `app_config` (the example upstream's schema) with CT_ROWS rows of
# tenant `acme`. Then, for CT_ROUNDS rounds, each variant (order alternating
# between rounds, so none always goes first):
#   none       no capture: wal_level=replica, no triggers, default replica
#              identity, no sidecache
#   triggers   the SQL of `sidecache capture-ddl` (mode: triggers: the
#              outbox table and the statement-level capture triggers) on
#              the table; sidecache runs, so its outbox worker drains the
#              rows as they come (the table stays small, as in production)
#   triggers_idle  the same triggers with no sidecache running: the outbox
#              rows accumulate (the service's side of the cost alone, no
#              worker competing for the machine)
#   triggers_nonotify  triggers_idle without the outbox's statement
#              trigger that NOTIFYs the workers (not a supported setup: the
#              workers would only poll; it shows what the NOTIFY costs)
#   wal        wal_level=logical but nothing else (no slot, no publication):
#              the part of the logical mode's cost that the setting alone
#              adds
#   logical    wal_level=logical, the SQL of `capture-ddl` for mode: logical
#              (publication, REPLICA IDENTITY FULL), and sidecache streaming
#              the slot (it creates the slot; dropped again after the run)
# For each: VACUUM and CHECKPOINT, then pgbench -T CT_DURATION with the
# custom script
#   \set id random(1, CT_ROWS)
#   UPDATE app_config SET version = version + 1 WHERE tenant = 'acme' AND id = :id;
# Reports per variant the median over rounds of tps, mean latency and WAL
# bytes per transaction, and the ratios against `none` (with / without).
# See bench/README.md ("Change capture").
#
# Environment (defaults in brackets):
#   CT_DURATION [15]       seconds per pgbench run
#   CT_CLIENTS [8]         pgbench clients (-c)
#   CT_THREADS [2]         pgbench threads (-j)
#   CT_ROUNDS [3]          runs per variant (medians are reported: 3 or more)
#   CT_ROWS [10000]        rows of tenant acme the updates pick from
#   CT_VARIANTS ["none triggers triggers_idle triggers_nonotify wal logical"]
#   CT_WARMUP [5]          seconds of unrecorded pgbench (variant none) first
#   CT_TAGS                set to map a tag too (`tags: ["tenant:{tenant}"]`:
#                          one more outbox row per statement in triggers mode)
#   CT_FSYNC [off]         Postgres fsync (off: the temp dir is on a shared
#                          disk; on: every commit waits for its WAL flush,
#                          and NOTIFYing commits queue behind each other)
#   CT_SKIP_BUILD          set to use an existing binary instead of running cargo
#   SIDECACHE_BIN          binary (default target/release/sidecache)
#   PG_BIN                 Postgres server binaries (default: newest
#                          /usr/lib/postgresql/*/bin)
#   SIDECACHE_LOG [warn]   sidecache's log level
#   CT_KEEP                set to keep the temp dir (configs, logs)
set -euo pipefail
prog=capture_triggers
# shellcheck source=bench/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
# No CPU pinning: the database and sidecache share the machine as they come.
on_servers=()

cd "$(dirname "${BASH_SOURCE[0]}")/.."
root=$(pwd)

duration=${CT_DURATION:-15}
clients=${CT_CLIENTS:-8}
threads=${CT_THREADS:-2}
rounds=${CT_ROUNDS:-3}
rows=${CT_ROWS:-10000}
fsync=${CT_FSYNC:-off}
read -r -a variants <<<"${CT_VARIANTS:-none triggers triggers_idle triggers_nonotify wal logical}"
sidecache_bin=${SIDECACHE_BIN:-$root/target/release/sidecache}

for v in DURATION:duration CLIENTS:clients THREADS:threads ROUNDS:rounds ROWS:rows; do
    name=${v#*:}
    value=${!name}
    [[ $value =~ ^[0-9]+$ && $value -gt 0 ]] || die "CT_${v%%:*} must be a positive integer (got '$value')"
done
((clients >= threads)) || die "CT_CLIENTS must be at least CT_THREADS"
[[ $fsync == on || $fsync == off ]] || die "CT_FSYNC must be on or off (got '$fsync')"
((${#variants[@]} > 0)) || die "CT_VARIANTS is empty"
for s in "${variants[@]}"; do
    [[ $s =~ ^(none|triggers|triggers_idle|triggers_nonotify|wal|logical)$ ]] ||
        die "unknown variant '$s' in CT_VARIANTS (known: none triggers triggers_idle triggers_nonotify wal logical)"
done
has() { local s; for s in "${variants[@]}"; do [[ $s == "$1" ]] && return 0; done; return 1; }
has none || die "CT_VARIANTS must include none (the baseline of every ratio)"

# ---------------------------------------------------------------- tools ----
# shellcheck disable=SC2012 # version-sorted directory names
find_pg() { echo "${PG_BIN:-$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1 || true)}"; }
pg_bin=$(find_pg)
missing=()
command -v curl >/dev/null || missing+=(curl)
command -v redis-server >/dev/null && command -v redis-cli >/dev/null || missing+=(redis-server)
command -v psql >/dev/null || missing+=(postgresql-client)
[[ -n $pg_bin && -x $pg_bin/initdb && -x $pg_bin/postgres && -x $pg_bin/pgbench ]] || missing+=(postgresql postgresql-contrib)
install_missing "${missing[@]}"
pg_bin=$(find_pg)
[[ -n $pg_bin && -x $pg_bin/initdb && -x $pg_bin/pgbench ]] || die "no Postgres server binaries with pgbench (set PG_BIN)"

if [[ -z ${CT_SKIP_BUILD:-} ]]; then
    note "building the release binary"
    cargo build --release --locked --bin sidecache
fi
[[ -x $sidecache_bin ]] || die "no sidecache binary at $sidecache_bin (cargo build --release --bin sidecache)"

# ------------------------------------------------------------ processes ----
work_dir capture_triggers CT_KEEP
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

redis_port=$(free_port)
mkdir -p "$work/redis"
start redis redis-server --port "$redis_port" --bind 127.0.0.1 --save "" --appendonly no \
    --dir "$work/redis" --daemonize no
wait_until redis redis-cli -p "$redis_port" ping

pg_port=$(free_port)
pg_url="postgres://postgres@127.0.0.1:$pg_port/postgres"
mkdir -p "$work/pg"
[[ $EUID -eq 0 ]] && chown postgres:postgres "$work/pg"
"${as_pg[@]}" "$pg_bin/initdb" -U postgres -A trust -E UTF8 --locale=C --no-sync \
    -D "$work/pg/data" >"$work/initdb.log" 2>&1 || { cat "$work/initdb.log" >&2; die "initdb failed"; }
# shellcheck disable=SC2120 # arguments come through wait_until
psql_do() { PGOPTIONS='-c client_min_messages=warning' psql -X -q -v ON_ERROR_STOP=1 "$pg_url" "$@"; }
psql_val() { psql_do -At -c "$1"; }

# pg_start WAL_LEVEL: (re)starts Postgres with that wal_level.
pg_level=''
pg_start() {
    [[ $pg_level == "$1" ]] && return 0
    if [[ -n $pg_level ]]; then
        stop_postmaster "$work/pg/data"
        wait "${pid_of[postgres]}" 2>/dev/null || true
        unset "pid_of[postgres]"
    fi
    start postgres "${as_pg[@]}" "$pg_bin/postgres" -D "$work/pg/data" -p "$pg_port" -h 127.0.0.1 \
        -k "$work/pg" -c fsync="$fsync" -c wal_level="$1" -c max_wal_size=4GB \
        -c max_connections=100
    wait_until postgres psql_do -c 'SELECT 1'
    pg_level=$1
}
pg_start replica
psql_do <<EOF
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
EOF
cat >"$work/update.sql" <<EOF
\\set id random(1, $rows)
UPDATE app_config SET version = version + 1 WHERE tenant = 'acme' AND id = :id;
EOF

# config MODE: sidecache's config for capture in MODE (no origin: nothing
# is read through it here).
proxy_port=$(free_port)
admin_port=$(free_port)
admin=http://127.0.0.1:$admin_port
tags_line=''
[[ -n ${CT_TAGS:-} ]] && tags_line='        tags: ["tenant:{tenant}"]'
config() {
    cat <<EOF
version: 1
listen: 127.0.0.1:$proxy_port
admin:
  listen: 127.0.0.1:$admin_port
upstream:
  url: http://127.0.0.1:9
store:
  redis:
    url: redis://127.0.0.1:$redis_port/0
  namespace: "ct:"
invalidation:
  capture:
    mode: $1
    url: "$pg_url"
    tables:
      - table: public.app_config
        route: app
        params: { tenant: "{tenant}", id: "{id}" }
$tags_line
routes:
  - name: app
    path: /api/tenants/{tenant}/apps/{id}
    params:
      tenant: "[A-Za-z0-9_-]{1,64}"
      id: "[1-9][0-9]{0,17}"
    ttl: 60s
EOF
}
config triggers >"$work/triggers.yaml"
config logical >"$work/logical.yaml"
"$sidecache_bin" capture-ddl --config "$work/triggers.yaml" >"$work/triggers.sql" ||
    die "capture-ddl (triggers) failed"
"$sidecache_bin" capture-ddl --config "$work/triggers.yaml" --drop >"$work/triggers-drop.sql" ||
    die "capture-ddl --drop failed"
"$sidecache_bin" capture-ddl --config "$work/logical.yaml" >"$work/logical.sql" ||
    die "capture-ddl (logical) failed"

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

start_sidecache() { # start_sidecache MODE
    start sidecache env SIDECACHE_LOG="${SIDECACHE_LOG:-warn}" \
        "$sidecache_bin" run --config "$work/$1.yaml"
    wait_until sidecache http_ok "$admin/readyz"
}

slot_active() { [[ $(psql_val 'SELECT count(*) FROM pg_replication_slots WHERE active') == 1 ]]; }

# setup VARIANT / teardown VARIANT: what the variant needs around its run.
setup() {
    case $1 in
    none) pg_start replica ;;
    triggers)
        pg_start replica
        psql_do -f "$work/triggers.sql" >/dev/null
        start_sidecache triggers
        ;;
    triggers_idle)
        pg_start replica
        psql_do -f "$work/triggers.sql" >/dev/null
        ;;
    triggers_nonotify)
        pg_start replica
        psql_do -f "$work/triggers.sql" >/dev/null
        psql_do -c 'DROP TRIGGER sidecache_outbox_notify ON sidecache_outbox' >/dev/null
        ;;
    wal) pg_start logical ;;
    logical)
        pg_start logical
        psql_do -f "$work/logical.sql" >/dev/null
        start_sidecache logical
        # Streaming: the slot exists and is active.
        wait_until sidecache slot_active
        ;;
    esac
}
teardown() {
    case $1 in
    triggers | triggers_idle | triggers_nonotify)
        [[ $1 == triggers ]] && stop sidecache
        psql_do -f "$work/triggers-drop.sql" >/dev/null
        # DROP: the next install creates the table and its NOTIFY trigger anew.
        psql_do -c 'DROP TABLE sidecache_outbox' >/dev/null
        ;;
    logical)
        stop sidecache
        psql_do -c "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots" \
            -c 'DROP PUBLICATION IF EXISTS sidecache' \
            -c 'ALTER TABLE app_config REPLICA IDENTITY DEFAULT' >/dev/null
        ;;
    esac
}

results=$work/results.tsv
: >"$results"

# CPU ticks (utime + stime, 1/100 s) so far: pg_ticks: every Postgres
# process (the postmaster, its live children, and those it has reaped:
# pgbench's backends end with the run); walsender_ticks: the walsenders
# alone; ticks_of PID: one process (0 if it is gone or not given).
ticks_of() { awk '{ print $14 + $15 }' "/proc/$1/stat" 2>/dev/null || echo 0; }
postmaster() { head -n 1 "$work/pg/data/postmaster.pid"; }
pg_ticks() {
    local pm pid total
    pm=$(postmaster)
    total=$(awk '{ print $14 + $15 + $16 + $17 }' "/proc/$pm/stat")
    for pid in $(pgrep -P "$pm" || true); do total=$((total + $(ticks_of "$pid"))); done
    echo "$total"
}
walsender_ticks() {
    local pid total=0
    for pid in $(pgrep -P "$(postmaster)" || true); do
        if tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q walsender; then
            total=$((total + $(ticks_of "$pid")))
        fi
    done
    echo "$total"
}
# cpu_sample: "postgres walsender sidecache redis" ticks so far.
cpu_sample() {
    echo "$(pg_ticks) $(walsender_ticks) $(ticks_of "${pid_of[sidecache]:-0}") $(ticks_of "${pid_of[redis]}")"
}

# measure VARIANT ROUND: one pgbench run; appends
# "variant round tps latency_ms wal_bytes_per_tx transactions extra".
measure() {
    local variant=$1 round=$2 lsn0 lsn1 out tps lat tx wal extra='' cpu0 cpu1 pg_us ws_us sc_us
    setup "$variant"
    psql_do -c 'VACUUM app_config' -c 'CHECKPOINT' >/dev/null
    lsn0=$(psql_val 'SELECT pg_current_wal_lsn()')
    cpu0=$(cpu_sample)
    "$pg_bin/pgbench" -n -M prepared -c "$clients" -j "$threads" -T "$duration" \
        -f "$work/update.sql" -h 127.0.0.1 -p "$pg_port" -U postgres postgres \
        >"$work/pgbench-$variant-$round.log" 2>&1 ||
        die "pgbench failed ($variant, round $round): $(tail -n 5 "$work/pgbench-$variant-$round.log")"
    sleep 0.3 # pgbench's backends reaped: their time is the postmaster's now
    cpu1=$(cpu_sample)
    lsn1=$(psql_val 'SELECT pg_current_wal_lsn()')
    out=$work/pgbench-$variant-$round.log
    tps=$(sed -n 's/^tps = \([0-9.]*\).*/\1/p' "$out" | head -n 1)
    lat=$(sed -n 's/^latency average = \([0-9.]*\) ms.*/\1/p' "$out")
    tx=$(sed -n 's/^number of transactions actually processed: \([0-9]*\).*/\1/p' "$out")
    [[ -n $tps && -n $lat && -n $tx ]] || die "cannot read pgbench's output: $out"
    wal=$(psql_val "SELECT round(pg_wal_lsn_diff('$lsn1', '$lsn0') / $tx)")
    # CPU microseconds per transaction: Postgres (all of it), of which the
    # walsender, and sidecache + redis-server (the consumer's side).
    read -r pg_us ws_us sc_us < <(paste -d' ' <(tr ' ' '\n' <<<"$cpu0") <(tr ' ' '\n' <<<"$cpu1") |
        awk -v tx="$tx" '{ d[NR] = ($2 - $1) * 10000 / tx } END { printf "%.0f %.0f %.0f\n", d[1], d[2], d[3] + d[4] }')
    case $variant in
    triggers)
        # Let the worker finish, then what it applied and what is left.
        sleep 1
        extra="outbox rows applied $(metric sidecache_invalidations_total 'source="outbox"' 'outcome="applied"')"
        extra+=", left $(psql_val 'SELECT count(*) FROM sidecache_outbox')"
        ;;
    triggers_idle | triggers_nonotify) extra="outbox rows accumulated $(psql_val 'SELECT count(*) FROM sidecache_outbox')" ;;
    logical)
        sleep 1
        extra="events applied $(metric sidecache_invalidations_total 'source="capture"' 'outcome="applied"')"
        extra+=", lag $(metric sidecache_capture_lag_bytes) bytes"
        ;;
    esac
    alive postgres
    [[ -n ${pid_of[sidecache]:-} ]] && alive sidecache
    teardown "$variant"
    printf '%s\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$variant" "$round" "$tps" "$lat" "$wal" "$tx" "$extra" \
        "$pg_us" "$ws_us" "$sc_us" >>"$results"
    note "  $variant round $round: $tps tps, latency $lat ms, $wal WAL bytes/tx," \
        "CPU/tx: Postgres $pg_us us (walsender $ws_us), sidecache+redis $sc_us us${extra:+; $extra}"
}

warmup=${CT_WARMUP:-5}
if ((warmup > 0)); then
    note "warm-up: ${warmup}s of pgbench, not recorded"
    "$pg_bin/pgbench" -n -M prepared -c "$clients" -j "$threads" -T "$warmup" \
        -f "$work/update.sql" -h 127.0.0.1 -p "$pg_port" -U postgres postgres >"$work/pgbench-warmup.log" 2>&1 ||
        die "pgbench failed (warm-up): $(tail -n 5 "$work/pgbench-warmup.log")"
fi
note "${variants[*]}: $rounds rounds x ${duration}s, $clients clients, $threads threads, $rows rows, fsync=$fsync${CT_TAGS:+, with a tag};" \
    "~$(((rounds * ${#variants[@]} * (duration + 8)) / 60 + 1)) min"
for ((round = 1; round <= rounds; round++)); do
    list=("${variants[@]}")
    if ((round % 2 == 0)); then # alternate the order so no variant always goes first
        for ((i = 0, j = ${#list[@]} - 1; i < j; i++, j--)); do
            tmp=${list[i]} list[i]=${list[j]} list[j]=$tmp
        done
    fi
    for variant in "${list[@]}"; do measure "$variant" "$round"; done
done

# --------------------------------------------------------------- report ----
echo
printf 'Capture cost on writes: pgbench %ss x %d rounds, %d clients, UPDATE of one of %d rows, fsync=%s%s\n\n' \
    "$duration" "$rounds" "$clients" "$rows" "$fsync" "${CT_TAGS:+, mapping with a tag}"
printf '%-17s %8s %8s %9s %9s %7s %10s %10s %10s\n' variant tps 'lat ms' 'tps ratio' 'lat ratio' 'WAL B' 'pg us/tx' 'walsender' 'sc+redis'
awk -F'\t' '
    function median(list,   a, n, i, j, t) {
        n = split(list, a, " ")
        for (i = 2; i <= n; i++) { t = a[i]; for (j = i - 1; j >= 1 && a[j] + 0 > t + 0; j--) a[j + 1] = a[j]; a[j + 1] = t }
        return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
    }
    { k = $1; if (!(k in tps)) order[++m] = k
      tps[k] = tps[k] " " $3; lat[k] = lat[k] " " $4; wal[k] = wal[k] " " $5
      pg[k] = pg[k] " " $8; ws[k] = ws[k] " " $9; sc[k] = sc[k] " " $10
      t_of[k, $2] = $3; l_of[k, $2] = $4; rounds[$2] = 1 }
    END {
        for (i = 1; i <= m; i++) { k = order[i]; rt = ""; rl = ""
            # Each round against the same round of none (measured minutes
            # apart at most): drift between rounds cancels.
            for (r in rounds) if ((k, r) in t_of && ("none", r) in t_of) {
                rt = rt " " t_of[k, r] / t_of["none", r]; rl = rl " " l_of[k, r] / l_of["none", r] }
            printf "%-17s %8.0f %8.3f %8.3fx %8.3fx %7.0f %10.0f %10.0f %10.0f\n", k, median(tps[k]), median(lat[k]),
                median(rt), median(rl), median(wal[k]), median(pg[k]), median(ws[k]), median(sc[k]) }
    }' "$results"
echo '(medians over the rounds; ratios: median over the rounds of the variant / none of the same round, so'
echo ' a tps ratio below 1 and a latency ratio above 1 are the cost; WAL B: WAL bytes per transaction;'
echo ' pg us/tx: CPU of every Postgres process per transaction, of which the walsender; sc+redis: sidecache'
echo ' and redis-server CPU per transaction, the consumer side)'
echo
echo 'per round (tps):'
awk -F'\t' '{ k = $1; if (!(k in runs)) order[++m] = k; runs[k] = runs[k] sprintf(" %8.0f", $3) }
    END { for (i = 1; i <= m; i++) printf "  %-17s%s\n", order[i], runs[order[i]] }' "$results"

mkdir -p "$root/bench/out"
out=$root/bench/out/capture_triggers-$(date -u +%Y%m%dT%H%M%SZ).json
{
    printf '{"git_commit": "%s", "loadavg": "%s", "duration_s": %d, "clients": %d, "threads": %d, "rows": %d, "fsync": "%s", "tags": %s, "runs": [\n' \
        "$(git rev-parse HEAD 2>/dev/null || echo unknown)" "$(cut -d' ' -f1-3 /proc/loadavg)" "$duration" "$clients" \
        "$threads" "$rows" "$fsync" "$([[ -n ${CT_TAGS:-} ]] && echo true || echo false)"
    awk -F'\t' '{ printf "%s  {\"variant\": \"%s\", \"round\": %d, \"tps\": %s, \"latency_ms\": %s, \"wal_bytes_per_tx\": %s, \"transactions\": %d, \"note\": \"%s\", \"pg_cpu_us_per_tx\": %s, \"walsender_cpu_us_per_tx\": %s, \"sidecache_redis_cpu_us_per_tx\": %s}",
                  (NR > 1 ? ",\n" : ""), $1, $2, $3, $4, $5, $6, $7, $8, $9, $10 } END { print "" }' "$results"
    printf ']}\n'
} >"$out"
echo "raw numbers: $out"
