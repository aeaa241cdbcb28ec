#!/usr/bin/env bash
# The embedded store (src/store/memory/) measured: memory per cached object,
# RSS against the byte budget, a crawler through a small budget next to a
# Zipf hot set, and HIT req/s against the Redis store. Everything runs on
# loopback, nothing is shared.
#
# Starts, on free loopback ports in a temp dir: the example upstream in
# memory (its default small JSON documents, or padded to
# EMB_PAYLOAD_BYTES; --apps large enough for every id below), and one
# sidecache per phase with the embedded store (no `store.redis`), route
# `app` for /api/tenants/{tenant}/apps/{id}, ttl 1h, fill.max_concurrency
# 32 (above the 12 connections used here, so fill admission never sheds:
# any 5xx would be the store's). Phases (EMB_PHASES, in this order):
#   overhead  store.memory.max_bytes = EMB_OVERHEAD_BUDGET (holds all).
#             RSS (VmRSS of /proc/PID/status) idle, then after a warm-up of
#             1 000 objects (runtime, pools and buffers allocated), then after
#             EMB_OBJECTS more distinct objects (bench/crawl.lua, one wrk
#             thread, 8 connections). Per object beyond its body:
#             (RSS delta - entries delta x mean body) / entries delta, the
#             mean body from six sampled answers (ids differ in digits).
#             Also the store's own charge (sidecache_memory_store_bytes) per
#             entry and the keys per entry.
#   crawler   store.memory.max_bytes = EMB_BUDGET. Idle RSS (the fixed
#             base); the EMB_HOT_OBJECTS hot objects (bench/zipf.lua's
#             numbering) fetched once; the Zipf load alone for EMB_HOT_ALONE
#             s (wrk -c4, BENCH_DELAY_MS=EMB_HOT_DELAY_MS per request and
#             connection); then the same Zipf load running while a crawler
#             (wrk -c8, no pause) walks EMB_CRAWL_IDS distinct ids that
#             are not in the hot set, each once. RSS, store bytes, entries,
#             keys and evictions are sampled every second throughout.
#             Reports: answers by X-Cache and status per load, evictions by
#             kind, RSS at the moment the store first reaches 95 % of its
#             budget, the highest and the last RSS after it, and
#             (RSS - base) / budget.
#   hit       bench/run.sh with BENCH_SCENARIOS=hit BENCH_SKIP_BUILD=1 and
#             these binaries, once per store in EMB_HIT_STORES, EMB_HIT_RUNS
#             times, the order alternating (a b, b a, ...): sidecache's HIT
#             req/s as a ratio to nginx proxy_cache measured in the same run
#             (run.sh pins servers to CPU 0, wrk to CPU 1).
# Prints the raw numbers as tables; with EMB_KEEP the temp dir (configs,
# logs, the per-second samples rss.tsv) is kept.
# See bench/README.md ("Embedded store").
#
# Environment (defaults in brackets):
#   EMB_PHASES ["overhead crawler hit"]
#   EMB_OBJECTS [100000]         objects filled in the overhead phase
#   EMB_OVERHEAD_BUDGET [1GiB]   budget of the overhead phase (must hold them all)
#   EMB_BUDGET [64MiB]           budget of the crawler phase
#   EMB_CRAWL_IDS [1000000]      distinct ids the crawler walks
#   EMB_HOT_OBJECTS [10000]      Zipf hot set (even: two tenants)
#   EMB_HOT_ALONE [10]           seconds of the Zipf load before the crawler
#   EMB_HOT_DELAY_MS [1]         pause per request and connection of the Zipf load
#   EMB_PAYLOAD_BYTES [0]        origin --payload-bytes (0: its default small JSON)
#   EMB_HIT_STORES ["redis embedded"]  BENCH_SIDECACHE_STORE values for the hit phase
#   EMB_HIT_RUNS [2]             run.sh runs per store
#   EMB_SKIP_BUILD               set to use existing binaries instead of running cargo
#   SIDECACHE_BIN, UPSTREAM_BIN  binaries (default target/release/...)
#   SIDECACHE_LOG [warn]         sidecache's log level
#   EMB_KEEP                     set to keep the temp dir
set -euo pipefail
# The example origin runs in memory: a DATABASE_URL in the caller's shell
# would switch it to Postgres mode.
unset DATABASE_URL
prog=embedded_store
# shellcheck source=bench/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
# No CPU pinning (except in run.sh's hit phase): a sidecar in a Pod is not
# pinned either.
on_servers=()

cd "$(dirname "${BASH_SOURCE[0]}")/.."
root=$(pwd)

read -r -a phases <<<"${EMB_PHASES:-overhead crawler hit}"
objects=${EMB_OBJECTS:-100000}
overhead_budget=${EMB_OVERHEAD_BUDGET:-1GiB}
budget=${EMB_BUDGET:-64MiB}
crawl_ids=${EMB_CRAWL_IDS:-1000000}
hot=${EMB_HOT_OBJECTS:-10000}
hot_alone=${EMB_HOT_ALONE:-10}
hot_delay=${EMB_HOT_DELAY_MS:-1}
payload=${EMB_PAYLOAD_BYTES:-0}
read -r -a hit_stores <<<"${EMB_HIT_STORES:-redis embedded}"
hit_runs=${EMB_HIT_RUNS:-2}
sidecache_bin=${SIDECACHE_BIN:-$root/target/release/sidecache}
upstream_bin=${UPSTREAM_BIN:-$root/target/release/examples/upstream}

for v in OBJECTS:objects CRAWL_IDS:crawl_ids HOT_OBJECTS:hot HOT_ALONE:hot_alone HIT_RUNS:hit_runs; do
    name=${v#*:}
    value=${!name}
    [[ $value =~ ^[0-9]+$ && $value -gt 0 ]] || die "EMB_${v%%:*} must be a positive integer (got '$value')"
done
for v in HOT_DELAY_MS:hot_delay PAYLOAD_BYTES:payload; do
    name=${v#*:}
    value=${!name}
    [[ $value =~ ^[0-9]+$ ]] || die "EMB_${v%%:*} must be a whole number (got '$value')"
done
((hot % 2 == 0)) || die "EMB_HOT_OBJECTS must be even (two tenants)"
((${#phases[@]} > 0)) || die "EMB_PHASES is empty"
wants() { local s; for s in "${phases[@]}"; do [[ $s == "$1" ]] && return 0; done; return 1; }
for s in "${phases[@]}"; do
    [[ $s == overhead || $s == crawler || $s == hit ]] || die "unknown phase '$s' in EMB_PHASES (known: overhead crawler hit)"
done
for s in "${hit_stores[@]}"; do
    [[ $s == redis || $s == redis-direct || $s == embedded ]] ||
        die "unknown store '$s' in EMB_HIT_STORES (known: redis redis-direct embedded)"
done
# to_bytes SIZE: 64MiB -> 67108864 (the suffixes the config takes).
to_bytes() {
    local n=${1%%[A-Za-z]*} unit=${1##*[0-9]}
    [[ $n =~ ^[0-9]+$ ]] || die "not a size: '$1'"
    case $unit in
    '' | B) echo "$n" ;;
    KiB) echo $((n << 10)) ;;
    MiB) echo $((n << 20)) ;;
    GiB) echo $((n << 30)) ;;
    *) die "size '$1': use B, KiB, MiB or GiB" ;;
    esac
}
budget_bytes=$(to_bytes "$budget")
overhead_budget_bytes=$(to_bytes "$overhead_budget")

# ---------------------------------------------------------------- tools ----
missing=()
command -v wrk >/dev/null || missing+=(wrk)
command -v curl >/dev/null || missing+=(curl)
command -v python3 >/dev/null || missing+=(python3)
install_missing "${missing[@]}"
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true

if [[ -z ${EMB_SKIP_BUILD:-} ]]; then
    note "building release binaries"
    cargo build --release --locked --bin sidecache --example upstream
fi
[[ -x $upstream_bin ]] || die "no origin binary at $upstream_bin (cargo build --release --example upstream)"
[[ -x $sidecache_bin ]] || die "no sidecache binary at $sidecache_bin (cargo build --release --bin sidecache)"

# ------------------------------------------------------------ processes ----
work_dir embedded_store EMB_KEEP

# stop NAME: terminates NAME and waits for it.
stop() {
    kill "${pid_of[$1]}" 2>/dev/null || true
    wait "${pid_of[$1]}" 2>/dev/null || true
    unset "pid_of[$1]"
}

# Every id any phase asks for: the overhead phase's warm-up and fill
# (offset 0), the hot set (ids 1..hot/2) and the crawl above it.
apps=$(((objects + 1000 + 1) / 2))
crawl_apps=$((hot / 2 + (crawl_ids + 1) / 2))
if wants crawler && ((crawl_apps > apps)); then apps=$crawl_apps; fi
if wants overhead || wants crawler; then
    origin_port=$(free_port)
    origin=http://127.0.0.1:$origin_port
    note "origin: --apps $apps per tenant"
    start origin "$upstream_bin" --listen "127.0.0.1:$origin_port" --apps "$apps" --payload-bytes "$payload"
    wait_until origin http_ok "$origin/healthz"
fi

# start_sidecache NAME BUDGET: sidecache with the embedded store; sets
# `proxy` and `admin` to its base URLs.
start_sidecache() {
    local name=$1 proxy_port admin_port
    proxy_port=$(free_port)
    admin_port=$(free_port)
    cat >"$work/$name.yaml" <<EOF
version: 1
listen: 127.0.0.1:$proxy_port
admin:
  listen: 127.0.0.1:$admin_port
upstream:
  url: $origin
  max_idle_per_host: 64
store:
  namespace: "emb:"
  memory:
    max_bytes: $2
fill:
  max_concurrency: 32
routes:
  - name: app
    path: /api/tenants/{tenant}/apps/{id}
    params:
      tenant: "[A-Za-z0-9_-]{1,64}"
      id: "[1-9][0-9]{0,17}"
    ttl: 1h
    negative_ttl: 5s
EOF
    start "$name" env SIDECACHE_LOG="${SIDECACHE_LOG:-warn}" "$sidecache_bin" run --config "$work/$name.yaml"
    wait_until "$name" http_ok "http://127.0.0.1:$admin_port/readyz"
    proxy=http://127.0.0.1:$proxy_port
    admin=http://127.0.0.1:$admin_port
}

rss_kib() { awk '/^VmRSS:/ { print $2 }' "/proc/${pid_of[$1]}/status"; }
# metric NAME [LABEL_SUBSTRING]: the sum of NAME's series (with that label
# text) on $admin/metrics; 0 if none.
metric() {
    curl -fsS --max-time 5 "$admin/metrics" |
        awk -v n="$1" -v l="${2:-}" '$1 == n || index($1, n "{") == 1 { if (l == "" || index($1, l)) s += $2 } END { printf "%.0f\n", s }'
}
metrics_snapshot() { curl -fsS --max-time 5 "$admin/metrics" >"$work/$1.prom"; }
# from_snapshot FILE NAME [LABEL_SUBSTRING]
from_snapshot() {
    awk -v n="$2" -v l="${3:-}" '$1 == n || index($1, n "{") == 1 { if (l == "" || index($1, l)) s += $2 } END { printf "%.0f\n", s }' "$work/$1.prom"
}

# wrk_lua NAME URL CONNECTIONS DURATION GENERATOR [ENV...]: one wrk thread
# with GENERATOR + xcache.lua; the XCACHE line goes to $work/NAME.xcache.
# With crawl.lua the run ends when every id has been answered (wrk is sent
# SIGINT once the generator writes its done file), DURATION being a limit.
wrk_lua() {
    local name=$1 url=$2 conns=$3 dur=$4 gen=$5 pid
    shift 5
    cat "$root/bench/$gen" "$root/bench/xcache.lua" >"$work/$name.lua"
    rm -f "$work/$name.done"
    env "$@" BENCH_CRAWL_DONE="$work/$name.done" wrk -t1 -c"$conns" -d"$dur" --timeout 10s \
        -s "$work/$name.lua" "$url" >"$work/$name.wrk" 2>&1 &
    pid=$!
    pid_of["wrk_$name"]=$pid
    if [[ $gen == crawl.lua ]]; then
        while kill -0 "$pid" 2>/dev/null && [[ ! -f $work/$name.done ]]; do sleep 0.2; done
        kill -INT "$pid" 2>/dev/null || true
    fi
    wait "$pid" || true
    unset "pid_of[wrk_$name]"
    grep '^XCACHE' "$work/$name.wrk" >"$work/$name.xcache" ||
        { cat "$work/$name.wrk" >&2; die "wrk $name printed no XCACHE line"; }
}
# xc NAME FIELD: a field of NAME's XCACHE line.
xc() { tr ' ' '\n' <"$work/$1.xcache" | awk -F= -v k="$2" '$1 == k { print $2 }'; }

# mean_body: mean body bytes of six answers of the origin (first, middle,
# last id of each tenant in 1..$1).
mean_body() {
    local last=$1 t id s=0
    for t in acme globex; do
        for id in 1 $(((last + 1) / 2)) "$last"; do
            s=$((s + $(curl -fsS -o /dev/null -w '%{size_download}' "$origin/api/tenants/$t/apps/$id")))
        done
    done
    echo $((s / 6))
}

# ------------------------------------------------------------- overhead ----
if wants overhead; then
    note "overhead: $objects objects into a $overhead_budget store"
    start_sidecache sc_overhead "$overhead_budget"
    sleep 2
    idle=$(rss_kib sc_overhead)
    # Warm-up: ids above the fill's range (1000 objects).
    wrk_lua ovh_warm "$proxy" 8 600s crawl.lua BENCH_CRAWL_IDS=1000 BENCH_CRAWL_OFFSET=$(((objects + 1) / 2))
    sleep 2
    before=$(rss_kib sc_overhead)
    e0=$(metric sidecache_memory_store_entries)
    k0=$(metric sidecache_memory_store_keys)
    b0=$(metric sidecache_memory_store_bytes)
    wrk_lua ovh_fill "$proxy" 8 600s crawl.lua BENCH_CRAWL_IDS="$objects" BENCH_CRAWL_OFFSET=0
    sleep 2
    after=$(rss_kib sc_overhead)
    e1=$(metric sidecache_memory_store_entries)
    k1=$(metric sidecache_memory_store_keys)
    b1=$(metric sidecache_memory_store_bytes)
    ev=$(metric sidecache_memory_store_evictions_total)
    body=$(mean_body $(((objects + 1) / 2)))
    [[ $(xc ovh_fill s5xx) == 0 ]] || note "WARNING: $(xc ovh_fill s5xx) 5xx answers during the fill"
    ((ev == 0)) || note "WARNING: $ev evictions: EMB_OVERHEAD_BUDGET does not hold every object"
    stop sc_overhead
    python3 - "$idle" "$before" "$after" "$e0" "$e1" "$k0" "$k1" "$b0" "$b1" "$body" "$ev" "$(xc ovh_fill miss)" "$(xc ovh_fill hit)" <<'EOF'
import sys
idle, before, after, e0, e1, k0, k1, b0, b1, body, ev, miss, hit = map(int, sys.argv[1:])
n = e1 - e0
drss = (after - before) * 1024
print()
print("overhead: %d objects filled (MISS %d, HIT %d), evictions %d" % (n, miss, hit, ev))
rows = [
    ("RSS idle (no request yet)", "%.1f MiB" % (idle / 1024)),
    ("RSS after 1 000-object warm-up", "%.1f MiB" % (before / 1024)),
    ("RSS after the fill", "%.1f MiB" % (after / 1024)),
    ("RSS delta", "%.1f MiB" % (drss / 2**20)),
    ("entries delta / keys delta", "%d / %d (%.2f keys per entry)" % (n, k1 - k0, (k1 - k0) / max(n, 1))),
    ("mean body (6 samples)", "%d B" % body),
    ("store charge delta (sidecache_memory_store_bytes)", "%.1f MiB = %.0f B per entry" % ((b1 - b0) / 2**20, (b1 - b0) / max(n, 1))),
    ("RSS per entry", "%.0f B" % (drss / max(n, 1))),
    ("RSS per entry beyond its body", "%.0f B" % ((drss - n * body) / max(n, 1))),
    ("store charge per entry beyond its body", "%.0f B" % ((b1 - b0 - n * body) / max(n, 1))),
    ("RSS delta / charge delta", "%.2f" % (drss / max(b1 - b0, 1))),
]
for k, v in rows:
    print("  %-52s %s" % (k, v))
EOF
fi

# -------------------------------------------------------------- crawler ----
if wants crawler; then
    note "crawler: $crawl_ids ids through a $budget store, Zipf over $hot hot objects"
    start_sidecache sc_crawl "$budget"
    sleep 2
    base=$(rss_kib sc_crawl)
    # Samples every second: seconds, VmRSS KiB, store bytes, entries, keys, evictions.
    sampler() {
        local t0=$SECONDS
        while kill -0 "${pid_of[sc_crawl]}" 2>/dev/null; do
            printf '%d\t%s\t%s\t%s\t%s\t%s\t%s\n' "$((SECONDS - t0))" "$(rss_kib sc_crawl)" \
                "$(metric sidecache_memory_store_bytes)" "$(metric sidecache_memory_store_entries)" \
                "$(metric sidecache_memory_store_keys)" "$(metric sidecache_memory_store_evictions_total)" \
                "$(cat "$work/stage" 2>/dev/null || echo -)"
            sleep 1
        done
    }
    echo idle >"$work/stage"
    sampler >"$work/rss.tsv" 2>/dev/null &
    pid_of[sampler]=$!
    echo prime >"$work/stage"
    wrk_lua hot_prime "$proxy" 4 600s crawl.lua BENCH_CRAWL_IDS="$hot" BENCH_CRAWL_OFFSET=0
    echo hot_alone >"$work/stage"
    metrics_snapshot m0
    wrk_lua hot_alone "$proxy" 4 "${hot_alone}s" zipf.lua BENCH_HOT_OBJECTS="$hot" BENCH_DELAY_MS="$hot_delay"
    metrics_snapshot m1
    echo crawl >"$work/stage"
    t_crawl=$SECONDS
    # The Zipf load in the background until the crawl ends (SIGINT: wrk
    # stops and reports).
    cat "$root/bench/zipf.lua" "$root/bench/xcache.lua" >"$work/hot_crawl.lua"
    BENCH_HOT_OBJECTS=$hot BENCH_DELAY_MS=$hot_delay wrk -t1 -c4 -d3600s --timeout 10s \
        -s "$work/hot_crawl.lua" "$proxy" >"$work/hot_crawl.wrk" 2>&1 &
    pid_of[hot_wrk]=$!
    wrk_lua crawl "$proxy" 8 3600s crawl.lua BENCH_CRAWL_IDS="$crawl_ids" BENCH_CRAWL_OFFSET=$((hot / 2))
    crawl_s=$((SECONDS - t_crawl))
    kill -INT "${pid_of[hot_wrk]}" 2>/dev/null || true
    wait "${pid_of[hot_wrk]}" 2>/dev/null || true
    unset "pid_of[hot_wrk]"
    grep '^XCACHE' "$work/hot_crawl.wrk" >"$work/hot_crawl.xcache" ||
        { cat "$work/hot_crawl.wrk" >&2; die "the Zipf wrk printed no XCACHE line"; }
    metrics_snapshot m2
    echo after >"$work/stage"
    sleep 5
    alive sc_crawl
    stop sampler
    stop sc_crawl

    echo
    printf 'crawler: %d distinct ids (%s) through store.memory.max_bytes=%s, in %d s\n' \
        "$crawl_ids" "$([[ $payload == 0 ]] && echo "default small JSON" || echo "padded to $payload B")" "$budget" "$crawl_s"
    printf '  %-22s %9s %9s %9s %9s %9s %7s %7s %7s %9s\n' load requests HIT MISS NEGATIVE other 2xx 4xx 5xx hit_ratio
    for r in hot_prime hot_alone hot_crawl crawl; do
        other=$(($(xc $r stale) + $(xc $r other) + $(xc $r none)))
        cached=$(($(xc $r hit) + $(xc $r miss) + $(xc $r negative) + $(xc $r stale) + $(xc $r other)))
        printf '  %-22s %9d %9d %9d %9d %9d %7d %7d %7d %9s\n' "$r" "$(xc $r requests)" "$(xc $r hit)" "$(xc $r miss)" \
            "$(xc $r negative)" "$other" "$(xc $r s2xx)" "$(xc $r s4xx)" "$(xc $r s5xx)" \
            "$(awk -v h="$(xc $r hit)" -v c="$cached" 'BEGIN { if (c > 0) printf "%.4f", h / c; else print "-" }')"
    done
    printf '  (req/s under load sharing 2 cores with other work; hot_crawl %.0f, crawl %.0f)\n' \
        "$(awk -v r="$(xc hot_crawl requests)" -v d="$(xc hot_crawl duration_us)" 'BEGIN { print r / (d / 1e6) }')" \
        "$(awk -v r="$(xc crawl requests)" -v d="$(xc crawl duration_us)" 'BEGIN { print r / (d / 1e6) }')"
    echo '  sidecache_requests_total{route="app"} during the crawl (m2 - m1):'
    for res in HIT MISS NEGATIVE STALE DEGRADED BYPASS; do
        d=$(($(from_snapshot m2 sidecache_requests_total "result=\"$res\"") - $(from_snapshot m1 sidecache_requests_total "result=\"$res\"")))
        ((d == 0)) || printf '    %-10s %d\n' "$res" "$d"
    done
    echo '  evictions by kind (whole run):'
    for kind in entry generation lease floor other; do
        printf '    %-10s %d\n' "$kind" "$(from_snapshot m2 sidecache_memory_store_evictions_total "kind=\"$kind\"")"
    done
    printf '  5xx answers seen by wrk: crawl %d, Zipf during the crawl %d\n' "$(xc crawl s5xx)" "$(xc hot_crawl s5xx)"
    python3 - "$work/rss.tsv" "$base" "$budget_bytes" <<'EOF'
import sys
path, base, budget = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rows = []
for line in open(path):
    f = line.rstrip("\n").split("\t")
    if len(f) < 7 or not f[1].isdigit():
        continue
    rows.append((int(f[0]), int(f[1]), int(f[2]), int(f[3]), int(f[4]), int(f[5]), f[6]))
mib = lambda kib: kib / 1024
print("  RSS, sampled every second (%d samples):" % len(rows))
print("    base (idle sidecache, no request yet): %.1f MiB; budget %.1f MiB" % (mib(base), budget / 2**20))
full = next((r for r in rows if r[2] >= 0.95 * budget), None)
if full is None:
    print("    the store never reached 95 % of its budget")
else:
    after = [r for r in rows if r[0] >= full[0]]
    top = max(after, key=lambda r: r[1])
    last = rows[-1]
    print("    store at 95 %% of budget at t=%d s: RSS %.1f MiB" % (full[0], mib(full[1])))
    print("    highest RSS after that: %.1f MiB at t=%d s; last: %.1f MiB at t=%d s" % (mib(top[1]), top[0], mib(last[1]), last[0]))
    print("    (highest RSS - base) / budget = %.3f   (target <= 1.15)" % ((top[1] - base) * 1024 / budget))
    print("    highest RSS / (1.15 x budget + base) = %.3f" % (top[1] * 1024 / (1.15 * budget + base * 1024)))
    crawl = [r for r in after if r[6] == "crawl"]
    if len(crawl) >= 4:
        h = len(crawl) // 2
        a = sum(r[1] for r in crawl[:h]) / h
        b = sum(r[1] for r in crawl[h:]) / (len(crawl) - h)
        print("    mean RSS, first / second half of the crawl after the fill: %.1f / %.1f MiB" % (mib(a), mib(b)))
print("    %6s %9s %11s %9s %9s %10s  %s" % ("t_s", "RSS_MiB", "store_MiB", "entries", "keys", "evictions", "stage"))
step = max(1, len(rows) // 30)
for i, r in enumerate(rows):
    if i % step == 0 or i == len(rows) - 1 or (full is not None and r is full):
        print("    %6d %9.1f %11.1f %9d %9d %10d  %s" % (r[0], mib(r[1]), r[2] / 2**20, r[3], r[4], r[5], r[6]))
EOF
fi

# ------------------------------------------------------------------ hit ----
if wants hit; then
    note "hit: bench/run.sh BENCH_SCENARIOS=hit per store (${hit_stores[*]}), $hit_runs runs each"
    order=()
    for ((r = 0; r < hit_runs; r++)); do
        if ((r % 2 == 0)); then
            order+=("${hit_stores[@]}")
        else
            for ((i = ${#hit_stores[@]} - 1; i >= 0; i--)); do order+=("${hit_stores[i]}"); done
        fi
    done
    : >"$work/hit.tsv"
    n=0
    for s in "${order[@]}"; do
        n=$((n + 1))
        note "hit run $n/${#order[@]}: store $s"
        BENCH_SCENARIOS=hit BENCH_SYSTEMS="nginx sidecache" BENCH_SIDECACHE_STORE=$s BENCH_SKIP_BUILD=1 \
            SIDECACHE_BIN=$sidecache_bin UPSTREAM_BIN=$upstream_bin \
            "$root/bench/run.sh" >"$work/hit-$n.out" 2>"$work/hit-$n.err" ||
            { tail -n 20 "$work/hit-$n.err" >&2; die "bench/run.sh failed (store $s)"; }
        json=$(awk '/^raw numbers: / { print $3 }' "$work/hit-$n.out")
        [[ -f $json ]] || die "bench/run.sh wrote no JSON (store $s; $work/hit-$n.out)"
        python3 - "$json" "$s" "$n" >>"$work/hit.tsv" <<'EOF'
import json, sys
d = json.load(open(sys.argv[1]))
s = {r["system"]: r for r in d["summary"] if r["scenario"] == "hit"}
n, c = s["nginx"], s["sidecache"]
print("\t".join(map(str, [sys.argv[3], sys.argv[2], round(n["rps_mean"]), round(c["rps_mean"]),
    "%.3f" % (c["rps_mean"] / n["rps_mean"]), c["p99_us_mean"], n["p99_us_mean"],
    c.get("cpu_us_per_request"), n.get("cpu_us_per_request"), d["host"]["loadavg"]])))
EOF
    done
    echo
    echo "hit: bench/run.sh BENCH_SCENARIOS=hit, 2 rounds per system, servers on CPU 0, wrk -t1 -c32 on CPU 1"
    printf '  %-4s %-13s %11s %15s %9s %13s %11s %12s %10s  %s\n' run store nginx_rps sidecache_rps ratio sc_p99_us ng_p99_us sc_cpu_us/req ng_cpu_us/req loadavg
    while IFS=$'\t' read -r run s nr cr ratio cp np cc nc load; do
        printf '  %-4s %-13s %11s %15s %9s %13s %11s %12s %10s  %s\n' "$run" "$s" "$nr" "$cr" "$ratio" "$cp" "$np" "$cc" "$nc" "$load"
    done <"$work/hit.tsv"
    echo '  mean sidecache/nginx ratio per store:'
    awk -F'\t' '{ s[$2] += $5; c[$2]++ } END { for (k in s) printf "    %-13s %.3f (%d runs)\n", k, s[k] / c[k], c[k] }' "$work/hit.tsv"
fi
