#!/usr/bin/env bash
# The time to invalidate a cache tag carried by many entries:
# starts its own redis-server, the example upstream and sidecache (release
# binaries: cargo build --release --bin sidecache --example upstream),
# fills TAGS_ENTRIES entries of route `object` that all carry the tag
# `shared:1` (upstream `/object/{n}?tags=2`), checks they are HITs, then
# times `POST /admin/invalidate {"tags":["shared:1"]}` and checks that every
# entry is a MISS afterwards. No key is scanned: the event replaces one key.
# Then the cost of tags on a hit: HIT req/s (wrk -t1 -c32, servers pinned to
# CPU 0 and wrk to CPU 1 as in bench/run.sh) of one 1 KiB entry of the
# untagged route `app`, and of `/object/1024` carrying 0, 1 and 5 tags,
# interleaved over TAGS_ROUNDS rounds; each mean against the untagged
# route and against the same entry with 0 tags.
#
#   TAGS_ENTRIES [10000]  TAGS_ROUNDS [3]  TAGS_DURATION [5] s per measurement
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
root=$(pwd)
prog=tags
entries=${TAGS_ENTRIES:-10000}
# shellcheck source=bench/lib.sh
source bench/lib.sh
on_servers=()
work_dir tags
origin_port=$(free_port)
start origin "$root/target/release/examples/upstream" --listen "127.0.0.1:$origin_port" --apps 10 \
    --payload-bytes 1024
wait_until origin http_ok "http://127.0.0.1:$origin_port/healthz"
redis_port=$(free_port)
start redis redis-server --port "$redis_port" --bind 127.0.0.1 --save "" --appendonly no --dir "$work"
wait_until redis redis-cli -p "$redis_port" ping
proxy_port=$(free_port)
admin_port=$(free_port)
mkdir -p "$work/config"
cat >"$work/config/sidecache.yaml" <<YAML
version: 1
listen: 127.0.0.1:$proxy_port
admin: { listen: 127.0.0.1:$admin_port }
upstream: { url: "http://127.0.0.1:$origin_port" }
store: { redis: { url: "redis://127.0.0.1:$redis_port/0" } }
routes:
  - name: app
    path: /api/tenants/{tenant}/apps/{id}
    params: { tenant: "[A-Za-z0-9_-]{1,64}", id: "[1-9][0-9]{0,17}" }
    ttl: 1h
  - name: object
    path: /object/{bytes}
    params: { bytes: "[0-9]{1,8}" }
    ttl: 1h
    tags_from: Surrogate-Key
YAML
start sidecache env SIDECACHE_LOG=warn "$root/target/release/sidecache" run --config "$work/config/sidecache.yaml"
wait_until sidecache http_ok "http://127.0.0.1:$admin_port/readyz"
python3 - "$proxy_port" "$admin_port" "$entries" <<'PY'
import http.client, sys, time
proxy, admin, n = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
c = http.client.HTTPConnection("127.0.0.1", proxy, timeout=30)
def get(i):
    c.request("GET", f"/object/{i}?tags=2")
    r = c.getresponse(); r.read()
    assert r.status == 200, r.status
    return r.getheader("X-Cache")
# The first fill of each object learns its tags, the second stores it.
for _ in range(2):
    for i in range(1, n + 1):
        get(i)
hits = sum(get(i) == "HIT" for i in range(1, n + 1))
assert hits == n, f"{hits} of {n} entries are HITs"
a = http.client.HTTPConnection("127.0.0.1", admin, timeout=30)
start = time.perf_counter()
a.request("POST", "/admin/invalidate", body=b'{"tags":["shared:1"]}')
r = a.getresponse(); r.read()
took = time.perf_counter() - start
assert r.status == 200, r.status
misses = sum(get(i) == "MISS" for i in range(1, n + 1))
print(f"{n} entries carrying tag shared:1: invalidated in {took * 1000:.2f} ms "
      f"(admin request round trip); {misses} of {n} reads afterwards were MISSes")
PY

# HIT req/s by tag count, one run.
command -v wrk >/dev/null || die "wrk not found (apt-get install wrk)"
rounds=${TAGS_ROUNDS:-3}
duration=${TAGS_DURATION:-5}
declare -A path_of=([untagged]=/api/tenants/acme/apps/1 [tags0]='/object/1024?tags=0'
    [tags1]='/object/1024?tags=1' [tags5]='/object/1024?tags=5')
kinds=(untagged tags0 tags1 tags5)
for k in "${kinds[@]}"; do
    url="http://127.0.0.1:$proxy_port${path_of[$k]}"
    for _ in 1 2 3; do curl -fsS -o /dev/null "$url"; done # fill, learn tags, store
    [[ $(curl -fsS -o /dev/null -D - "$url" | tr -d '\r' | awk -F': ' 'tolower($1) == "x-cache" { print $2 }') == HIT ]] ||
        die "$url is not a HIT"
done
# Pin now: the fills above ran unpinned.
taskset -acp 0 "${pid_of[sidecache]}" >/dev/null
taskset -acp 0 "${pid_of[redis]}" >/dev/null
declare -A sum=()
for ((round = 1; round <= rounds; round++)); do
    for k in "${kinds[@]}"; do
        url="http://127.0.0.1:$proxy_port${path_of[$k]}"
        taskset -c 1 wrk -t1 -c32 -d1s "$url" >/dev/null
        rps=$(taskset -c 1 wrk -t1 -c32 -d"${duration}s" "$url" | awk '/^Requests\/sec/ { print $2 }')
        sum[$k]=$(awk -v a="${sum[$k]:-0}" -v b="$rps" 'BEGIN { print a + b }')
        printf 'round %d  %-8s %10.0f req/s\n' "$round" "$k" "$rps"
    done
done
for k in "${kinds[@]}"; do
    awk -v k="$k" -v s="${sum[$k]}" -v u="${sum[untagged]}" -v z="${sum[tags0]}" -v n="$rounds" \
        'BEGIN { printf "mean     %-8s %10.0f req/s  %.3f of the untagged route, %.3f of the same route without tags\n", k, s / n, s / u, s / z }'
done
