#!/usr/bin/env bash
# Fleet scale: what background work costs the stores as the
# number of sidecache instances grows. Counts, not timings, so it runs on a
# busy machine. For each N in $FLEET_SIZES (default "1 5 20"): N instances
# (near cache 4 MiB each), one redis-server, one Postgres with
# pg_stat_statements, all on free loopback ports in a temp dir. A Bloom
# route with 200 scopes (`rebuild_every: 10s`, the minimum), every instance
# has seen every scope; the outbox feed idle for $FLEET_WINDOW s, then
# carrying 50 events/s for as long. Reported per phase: Postgres statements/s
# run by sidecache (pg_stat_statements, its own role), Redis commands/s
# (INFO commandstats: the only clients are the instances), Bloom builds
# activated per scope per interval, connections held, RSS per instance; for
# the event phase, per event: outbox statements (minus the idle phase's) and
# invalidation scripts (`sidecache_invalidations_total{kind="object"}`
# summed over the instances: one `invalidate_marked.lua` each), and which
# instances are witnesses (`invalidation.witnesses`, $FLEET_WITNESSES,
# default 2).
# See bench/README.md ("Fleet") for results, docs/capacity.md for the model.
set -euo pipefail
cd "$(dirname "$0")/.."
prog=fleet
on_servers=()
# shellcheck source=bench/lib.sh
source bench/lib.sh

SIZES=${FLEET_SIZES:-1 5 20}
WINDOW=${FLEET_WINDOW:-30}
SCOPES=200
REBUILD=10
WITNESSES=${FLEET_WITNESSES:-2}
BIN=${SIDECACHE_BIN:-target/debug/sidecache}
PGBIN=${PG_BIN:-$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -n 1)}
[[ -x $PGBIN/postgres ]] || die "no Postgres under /usr/lib/postgresql/*/bin (set PG_BIN)"
command -v redis-server >/dev/null || die "redis-server not found"
[[ -n ${SIDECACHE_BIN:-} ]] || cargo build --quiet --bin sidecache
work_dir fleet FLEET_KEEP
as_pg=()
[[ $(id -u) == 0 ]] && as_pg=(runuser -u postgres --)
# The postmaster (runuser may have forked it): fast shutdown by pid file.
# shellcheck disable=SC2317 # invoked by cleanup
extra_cleanup() { stop_postmaster "$work/pg/data"; }

rport=$(free_port)
pport=$(free_port)
start redis redis-server --port "$rport" --bind 127.0.0.1 --save "" --appendonly no --dir "$work" --maxclients 10000
mkdir -p "$work/pg"
if [[ $(id -u) == 0 ]]; then chmod 755 "$work"; chown postgres "$work/pg"; fi
"${as_pg[@]}" "$PGBIN/initdb" -U postgres -A trust --no-sync -D "$work/pg/data" >"$work/initdb.log" 2>&1 ||
    { cat "$work/initdb.log" >&2; die "initdb failed"; }
start postgres "${as_pg[@]}" "$PGBIN/postgres" -D "$work/pg/data" -p "$pport" -h 127.0.0.1 -k "$work/pg" \
    -c fsync=off -c max_connections=200 -c shared_preload_libraries=pg_stat_statements
wait_until redis redis-cli -p "$rport" ping
wait_until postgres "$PGBIN/pg_isready" -h 127.0.0.1 -p "$pport"
psql() { "$PGBIN/psql" -h 127.0.0.1 -p "$pport" -U postgres -d postgres -qAtX "$@"; }
rcli() { redis-cli -p "$rport" "$@"; }
psql -c "CREATE EXTENSION pg_stat_statements" \
    -c "CREATE ROLE sidecache LOGIN SUPERUSER" \
    -c "CREATE TABLE app_config (tenant text, id bigint, PRIMARY KEY (tenant, id))" \
    -c "INSERT INTO app_config SELECT 't' || s, i FROM generate_series(1, $SCOPES) s, generate_series(1, 50) i"
"$BIN" outbox-ddl | psql >/dev/null 2>&1

config() { # config PORT ADMIN_PORT
    cat <<EOF
version: 1
listen: 127.0.0.1:$1
admin: { listen: 127.0.0.1:$2 }
log_format: json
upstream: { url: "http://127.0.0.1:9" }
store:
  redis: { url: "redis://127.0.0.1:$rport/0", near_cache: { max_bytes: 4MiB } }
invalidation:
  outbox: { url: "postgres://sidecache@127.0.0.1:$pport/postgres" }
  witnesses: $WITNESSES
routes:
  - name: app
    path: /api/tenants/{tenant}/apps/{id}
    params: { tenant: "[a-z0-9]+", id: "[1-9][0-9]*" }
    ttl: 60s
    bloom:
      scope: "{tenant}"
      source: "SELECT id::text FROM app_config WHERE tenant = \$1"
      capacity: 1000
      fp_rate: 0.01
      rebuild_every: ${REBUILD}s
EOF
}

metric_sum() { # metric_sum NAME LABEL_FILTER: summed over the running instances
    local total=0 v
    for a in "${admins[@]}"; do
        v=$(curl -fsS --max-time 2 "http://127.0.0.1:$a/metrics" | grep -E "^$1[{ ]" | grep -E -- "$2" |
            awk '{s += $NF} END {print s + 0}')
        total=$(awk -v a="$total" -v b="$v" 'BEGIN {print a + b}')
    done
    echo "$total"
}

sidecache_oid() { psql -c "SELECT oid FROM pg_roles WHERE rolname = 'sidecache'"; }
pg_calls() { # pg_calls [FILTER]: statements run by sidecache (matching FILTER)
    psql -c "SELECT COALESCE(sum(calls), 0) FROM pg_stat_statements WHERE userid = $(sidecache_oid) ${1:+AND $1}"
}
# The outbox worker's statements (its transactions' BEGIN/COMMIT included).
FEED="(query ILIKE '%sidecache_outbox%' OR query IN ('START TRANSACTION', 'COMMIT'))"
redis_calls() {
    rcli INFO commandstats | tr -d '\r' | grep -vE '^cmdstat_(info|config)' |
        grep -oE 'calls=[0-9]+' | cut -d= -f2 | awk '{s += $1} END {print s + 0}'
}
redis_breakdown() {
    rcli INFO commandstats | tr -d '\r' | grep -vE '^cmdstat_(info|config)' |
        sed -nE 's/^cmdstat_([^:]+):calls=([0-9]+).*/\1=\2/p' | tr '\n' ' '
}
reset_counts() { psql -c "SELECT pg_stat_statements_reset()" >/dev/null; rcli CONFIG RESETSTAT >/dev/null; }

measure() { # measure PHASE N: counts over the last window (feed statements in $feed)
    local phase=$1 n=$2 pg redis builds rconn pconn rss
    pg=$(pg_calls)
    feed=$(pg_calls "$FEED")
    redis=$(redis_calls)
    builds=$(( $(metric_sum sidecache_bloom_builds_total 'outcome="activated"' | cut -d. -f1) - builds_before ))
    rconn=$(( $(rcli INFO clients | tr -d '\r' | sed -nE 's/^connected_clients:([0-9]+)/\1/p') - 1 ))
    pconn=$(psql -c "SELECT count(*) FROM pg_stat_activity WHERE usename = 'sidecache'")
    rss=0
    for i in $(seq "$n"); do
        rss=$((rss + $(awk '/VmRSS/ {print $2}' "/proc/${pid_of[sc$i]}/status")))
    done
    printf '%-5s N=%-3s pg stmt/s %7.2f (outbox %6.2f)  redis cmd/s %8.1f  builds/scope/interval %.2f  conns redis %-4s pg %-4s  RSS/instance %s MiB\n' \
        "$phase" "$n" "$(awk -v a="$pg" -v w="$WINDOW" 'BEGIN {print a / w}')" \
        "$(awk -v a="$feed" -v w="$WINDOW" 'BEGIN {print a / w}')" \
        "$(awk -v a="$redis" -v w="$WINDOW" 'BEGIN {print a / w}')" \
        "$(awk -v b="$builds" -v s="$SCOPES" -v w="$WINDOW" -v r="$REBUILD" 'BEGIN {print b / s / (w / r)}')" \
        "$rconn" "$pconn" "$((rss / n / 1024))"
    printf '      redis by command: %s\n' "$(redis_breakdown)"
    psql -F ' ' -c "SELECT calls, left(regexp_replace(query, '\s+', ' ', 'g'), 70) FROM pg_stat_statements
                    WHERE userid = $(sidecache_oid) ORDER BY calls DESC LIMIT 6" | sed 's/^/      pg: /'
}

for n in $SIZES; do
    admins=()
    for i in $(seq "$n"); do
        p=$(free_port); a=$(free_port)
        config "$p" "$a" >"$work/sc$i.yaml"
        start "sc$i" "$BIN" run --config "$work/sc$i.yaml"
        admins+=("$a")
    done
    for i in $(seq "$n"); do wait_until "sc$i" http_ok "http://127.0.0.1:${admins[$((i - 1))]}/metrics"; done
    # Every instance sees every scope once (the check starts a lazy build
    # where the filter is unknown; the request itself fails: no origin).
    python3 - "$work" "$n" "$SCOPES" <<'EOF'
import re, sys, http.client
work, n, scopes = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
for i in range(1, n + 1):
    port = int(re.search(r"listen: 127\.0\.0\.1:(\d+)", open(f"{work}/sc{i}.yaml").read()).group(1))
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    for s in range(1, scopes + 1):
        c.request("GET", f"/api/tenants/t{s}/apps/1")
        c.getresponse().read()
EOF
    sleep $((REBUILD + 5)) # lazy builds done, schedules running
    builds_before=$(metric_sum sidecache_bloom_builds_total 'outcome="activated"' | cut -d. -f1)
    reset_counts
    sleep "$WINDOW"
    measure idle "$n"
    idle_feed=$feed

    builds_before=$(metric_sum sidecache_bloom_builds_total 'outcome="activated"' | cut -d. -f1)
    scripts_before=$(metric_sum sidecache_invalidations_total 'kind="object"')
    reset_counts
    # 50 events/s: 5 rows every 100 ms, from psql (not counted: role postgres).
    end=$((SECONDS + WINDOW)); k=0
    while ((SECONDS < end)); do
        psql -c "INSERT INTO sidecache_outbox (route, params)
                 SELECT 'app', jsonb_build_object('tenant', 't1', 'id', $k * 5 + g) FROM generate_series(1, 5) g"
        k=$((k + 1)); sleep 0.1
    done
    events=$((k * 5))
    measure "50/s" "$n"
    printf '      %s events inserted (%.1f/s)\n' "$events" "$(awk -v e="$events" -v w="$WINDOW" 'BEGIN {print e / w}')"
    sleep 2 # the last rows applied
    scripts=$(awk -v a="$(metric_sum sidecache_invalidations_total 'kind="object"')" -v b="$scripts_before" 'BEGIN {print a - b}')
    printf '      per event: outbox statements %.2f, invalidation scripts %.2f; witnesses %s of %s\n' \
        "$(awk -v f="$feed" -v i="$idle_feed" -v e="$events" 'BEGIN {print (f - i) / e}')" \
        "$(awk -v s="$scripts" -v e="$events" 'BEGIN {print s / e}')" \
        "$(metric_sum sidecache_feed_witness 'feed="outbox"')" "$n"
    for i in $(seq "$n"); do kill "${pid_of[sc$i]}"; wait "${pid_of[sc$i]}" 2>/dev/null || true; unset "pid_of[sc$i]"; done
    psql -c "TRUNCATE sidecache_outbox"
    rcli FLUSHALL >/dev/null
done
