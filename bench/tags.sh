#!/usr/bin/env bash
# The time to invalidate a cache tag carried by many entries (issue 13):
# starts its own redis-server, the example upstream and sidecache (release
# binaries: cargo build --release --bin sidecache --example upstream),
# fills TAGS_ENTRIES entries of route `object` that all carry the tag
# `shared:1` (upstream `/object/{n}?tags=2`), checks they are HITs, then
# times `POST /admin/invalidate {"tags":["shared:1"]}` and checks that every
# entry is a MISS afterwards. No key is scanned: the event replaces one key.
#
#   TAGS_ENTRIES [10000]
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
start origin "$root/target/release/examples/upstream" --listen "127.0.0.1:$origin_port" --apps 10
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
