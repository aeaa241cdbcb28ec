#!/usr/bin/env bash
# What the fan-out of the invalidation feeds costs Redis per call
# (docs/invalidation.md, "No feed waits for one instance"): server time of
# invalidate.lua, of invalidate_marked.lua when it replaces a generation and
# when the event is covered already, and of the XAUTOCLAIM polling that a
# claim-based design would need. A redis-server of its own on a free port.
set -euo pipefail
cd "$(dirname "$0")/.."
N=${BENCH_CALLS:-200000}
dir=$(mktemp -d)
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no --dir "$dir" >/dev/null 2>&1 &
trap 'redis-cli -p "$port" shutdown nosave >/dev/null 2>&1 || true; rm -rf "$dir"' EXIT
for _ in $(seq 50); do redis-cli -p "$port" ping >/dev/null 2>&1 && break; sleep 0.1; done
r() { redis-cli -p "$port" "$@"; }
plain=$(r SCRIPT LOAD "$(cat lua/invalidate.lua)")
marked=$(r SCRIPT LOAD "$(cat lua/invalidate_marked.lua)")
measure() { # label, key range (-r), then the command for redis-benchmark
  local label=$1 range=$2; shift 2
  r CONFIG RESETSTAT >/dev/null
  redis-benchmark -p "$port" -n "$N" -c 4 -r "$range" -q "$@" >/dev/null
  printf '%-44s %s\n' "$label" "$(r INFO commandstats | grep -oE "cmdstat_${1,,}:.*" | grep -oE 'usec_per_call=[0-9.]+')"
}
key='sc:o:{app:__rand_int__}:g'
measure "invalidate.lua (before)" 100000000 EVALSHA "$plain" 1 "$key" 0123456789abcdef 160000
r FLUSHALL >/dev/null
measure "invalidate_marked.lua, replacing" 100000000 EVALSHA "$marked" 1 "$key" 0123456789abcdef 160000 s:1796118908010-0
r FLUSHALL >/dev/null
# Mark 1000 objects with the entry, then apply it (or an earlier one) again.
redis-benchmark -p "$port" -n 20000 -r 1000 -c 1 -q EVALSHA "$marked" 1 "$key" n 160000 s:1796118908010-0 >/dev/null
measure "invalidate_marked.lua, covered (same entry)" 1000 EVALSHA "$marked" 1 "$key" 0123456789abcdef 160000 s:1796118908010-0
measure "invalidate_marked.lua, covered (earlier)" 1000 EVALSHA "$marked" 1 "$key" 0123456789abcdef 160000 s:1796118908009-5
r XGROUP CREATE inv g '$' MKSTREAM >/dev/null
measure "XAUTOCLAIM, empty pending list" 1 XAUTOCLAIM inv g c1 30 0-0 COUNT 100
