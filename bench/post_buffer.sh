#!/usr/bin/env bash
# The cost of holding request bodies (limits.request_buffer) on the POST
# path: wrk `POST /sink` with a BENCH_POST_BYTES body (bench/post.lua)
# through two sidecache instances of the same binary, one with the
# defaults (bodies held) and one with `request_buffer: 0` (bodies stream,
# the behaviour before buffering), against one example origin, rounds
# interleaved so drift on the machine favours neither. Prints req/s and
# p50/p99 per round and the held/streamed ratios of the means.
#
#   bench/post_buffer.sh [SIDECACHE_BIN] [UPSTREAM_BIN]
#
# BENCH_ROUNDS (3), BENCH_DURATION (10 s), BENCH_CONNECTIONS (32),
# BENCH_POST_BYTES (1024). Needs wrk. See bench/README.md.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
sc_bin=${1:-$root/target/release/sidecache}
up_bin=${2:-$root/target/release/examples/upstream}
rounds=${BENCH_ROUNDS:-3}
duration=${BENCH_DURATION:-10}
conns=${BENCH_CONNECTIONS:-32}
export BENCH_POST_BYTES=${BENCH_POST_BYTES:-1024}
work=$(mktemp -d)
pids=()
trap 'kill "${pids[@]}" 2>/dev/null; rm -rf "$work"' EXIT

up_port=18670
"$up_bin" --listen 127.0.0.1:$up_port >/dev/null 2>&1 &
pids+=($!)
start_sc() { # name port admin limits
    cat >"$work/$1.yaml" <<YAML
version: 1
listen: 127.0.0.1:$2
admin: { listen: 127.0.0.1:$3 }
upstream: { url: "http://127.0.0.1:$up_port" }
limits: { $4 }
routes:
  - name: app
    path: /api/tenants/{tenant}/apps/{id}
    params: { tenant: "[a-z]+", id: "[1-9][0-9]*" }
    ttl: 60s
YAML
    SIDECACHE_LOG=warn "$sc_bin" run --config "$work/$1.yaml" >"$work/$1.log" 2>&1 &
    pids+=($!)
}
start_sc held 18680 18681 "request_buffer: 1MiB"
start_sc streamed 18690 18691 "request_buffer: 0"
sleep 1
for port in 18680 18690; do
    curl -fsS -o /dev/null -X POST --data-binary @/dev/null "http://127.0.0.1:$port/sink" ||
        { echo "no answer on $port" >&2; exit 1; }
done

measure() { # name port -> "rps p50_us p99_us"
    wrk -t1 -c"$conns" -d2s -s "$root/bench/post.lua" "http://127.0.0.1:$2/sink" >/dev/null
    wrk -t1 -c"$conns" -d"${duration}s" --latency -s "$root/bench/post.lua" \
        "http://127.0.0.1:$2/sink" >"$work/out"
    awk -v name="$1" '
        function us(v) { if (v ~ /us$/) return v+0; if (v ~ /ms$/) return v*1000; return v*1e6 }
        /Requests\/sec/ { rps = $2 }
        $1 == "50.000%" || $1 == "50%" { p50 = us($2) }
        $1 == "99.000%" || $1 == "99%" { p99 = us($2) }
        / Non-2xx/ { bad = $NF }
        END { printf "%s %.0f %.0f %.0f %s\n", name, rps, p50, p99, (bad == "" ? 0 : bad) }' "$work/out"
}
: >"$work/results"
for r in $(seq 1 "$rounds"); do
    if (( r % 2 )); then order="held streamed"; else order="streamed held"; fi
    for name in $order; do
        port=18680; [[ $name == streamed ]] && port=18690
        line=$(measure "$name" "$port")
        echo "round $r: $line (name rps p50_us p99_us non2xx)"
        echo "$line" >>"$work/results"
    done
done
awk '{ n[$1]++; rps[$1] += $2; p50[$1] += $3; p99[$1] += $4 }
     END {
       for (k in n) printf "%s: %.0f req/s, p50 %.0f us, p99 %.0f us (mean of %d)\n", k, rps[k]/n[k], p50[k]/n[k], p99[k]/n[k], n[k]
       printf "held / streamed: req/s %.3f, p50 %.3f, p99 %.3f\n", rps["held"]/rps["streamed"], p50["held"]/p50["streamed"], p99["held"]/p99["streamed"]
     }' "$work/results"
