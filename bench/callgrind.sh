#!/usr/bin/env bash
# Instructions per request of sidecache's hit path (or any path), with
# valgrind's callgrind: repeatable on a noisy machine, unlike req/s, so it is
# the tool for before/after comparisons of one change.
#
# Starts its own redis-server, the example upstream and sidecache under
# callgrind (pinned to one CPU, so tokio runs one worker), sends
# CALLGRIND_WARMUP requests, zeroes the counters, sends CALLGRIND_REQUESTS
# requests on one keep-alive connection, dumps, and prints instructions per
# request and the top functions (inclusive). Uses the release binaries
# (build them first: cargo build --release --bin sidecache --example upstream).
#
#   CALLGRIND_PATH [/api/tenants/acme/apps/1]  path to request (cached route: a HIT)
#   CALLGRIND_METHOD [GET]     e.g. POST (with CALLGRIND_PATH=/sink: forwarded, never cached)
#   CALLGRIND_BODY_BYTES [0]   request body of this many bytes (sent with Content-Length)
#   CALLGRIND_HEADER           one request header, e.g. 'If-None-Match: "object-1024"' with
#                              CALLGRIND_PATH=/object/1024 (route `object`, the origin's
#                              static-file-like objects), or 'Range: bytes=0-4095'
#   CALLGRIND_OBJECT_KEYS      more keys of route `object`, indented 4 spaces, e.g.
#                              '    tags_from: Surrogate-Key' with
#                              CALLGRIND_PATH='/object/1024?tags=5' (entries with 5 tags)
#   CALLGRIND_STATUS [200]     the status every answer must have (304, 206, ...)
#   CALLGRIND_REQUESTS [2000]  CALLGRIND_WARMUP [200]
#   CALLGRIND_STORE [redis]    redis | redis-direct (near cache off) | embedded |
#                              cluster (3-master Redis Cluster, near cache on) |
#                              cluster-direct (near cache off)
#   CALLGRIND_OUT              keep the callgrind output here (default: temp dir)
#   CALLGRIND_EXTRA            more top-level YAML for sidecache's config, e.g.
#                              'access_log: { enabled: true, format: json }'
#   CALLGRIND_SYSTEM [sidecache]  or nginx: the same requests through nginx with
#                              bench/nginx.conf.tmpl (one process, master_process
#                              off; the cached route is proxy_cache, the rest
#                              proxy_pass), the baseline for the counts above
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
root=$(pwd)
path=${CALLGRIND_PATH:-/api/tenants/acme/apps/1}
requests=${CALLGRIND_REQUESTS:-2000}
warmup=${CALLGRIND_WARMUP:-200}
store=${CALLGRIND_STORE:-redis}
method=${CALLGRIND_METHOD:-GET}
body_bytes=${CALLGRIND_BODY_BYTES:-0}
extra_header=${CALLGRIND_HEADER:-}
want_status=${CALLGRIND_STATUS:-200}
sidecache_bin=${SIDECACHE_BIN:-$root/target/release/sidecache}
upstream_bin=${UPSTREAM_BIN:-$root/target/release/examples/upstream}
command -v valgrind >/dev/null || { echo "callgrind: needs valgrind (apt-get install valgrind)" >&2; exit 1; }

work=$(mktemp -d "${TMPDIR:-/tmp}/sidecache-callgrind.XXXXXX")
pids=()
cleanup() {
    local p
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
    rm -rf "$work"
}
trap cleanup EXIT
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
# A free port whose cluster bus port (+10000) is free too.
cluster_port() {
    python3 -c '
import socket
for _ in range(100):
    s = socket.socket(); s.bind(("127.0.0.1", 0)); p = s.getsockname()[1]
    if p > 55535: continue
    try:
        b = socket.socket(); b.bind(("127.0.0.1", p + 10000)); print(p); break
    except OSError: pass'
}
wait_http() {
    local i
    for ((i = 0; i < 600; i++)); do
        curl -fsS -o /dev/null --max-time 1 "$1" 2>/dev/null && return 0
        sleep 0.1
    done
    echo "callgrind: $1 did not answer" >&2
    exit 1
}

origin_port=$(port)
"$upstream_bin" --listen "127.0.0.1:$origin_port" --apps 100 --payload-bytes 1024 >"$work/origin.log" 2>&1 &
pids+=($!)
store_yaml="store: { namespace: \"cg:\" }"
if [[ $store == redis* ]]; then
    redis_port=$(port)
    redis-server --port "$redis_port" --bind 127.0.0.1 --save "" --appendonly no --dir "$work" \
        >"$work/redis.log" 2>&1 &
    pids+=($!)
    near=$([[ $store == redis ]] && echo true || echo false)
    store_yaml="store: { namespace: \"cg:\", redis: { url: \"redis://127.0.0.1:$redis_port/0\", near_cache: { enabled: $near } } }"
elif [[ $store == cluster* ]]; then
    nodes=()
    for _ in 1 2 3; do
        p=$(cluster_port)
        mkdir -p "$work/node-$p"
        redis-server --port "$p" --bind 127.0.0.1 --save "" --appendonly no --dir "$work/node-$p" \
            --cluster-enabled yes --cluster-config-file nodes.conf >"$work/redis-$p.log" 2>&1 &
        pids+=($!)
        nodes+=("127.0.0.1:$p")
    done
    for n in "${nodes[@]}"; do
        for ((i = 0; i < 100; i++)); do
            redis-cli -p "${n#*:}" PING >/dev/null 2>&1 && break
            sleep 0.1
        done
    done
    redis-cli --cluster create "${nodes[@]}" --cluster-replicas 0 --cluster-yes >"$work/cluster.log" 2>&1
    for n in "${nodes[@]}"; do
        for ((i = 0; i < 100; i++)); do
            redis-cli -p "${n#*:}" CLUSTER INFO | grep -q cluster_state:ok && break
            sleep 0.1
        done
    done
    near=$([[ $store == cluster ]] && echo true || echo false)
    seeds=$(printf '"redis://%s", ' "${nodes[@]}")
    store_yaml="store: { namespace: \"cg:\", redis: { cluster: [${seeds%, }], near_cache: { enabled: $near } } }"
fi
proxy_port=$(port)
admin_port=$(port)
# The config gets a directory of its own: sidecache watches it, and the
# logs written beside it (stdout: the access log) would wake the watcher.
mkdir -p "$work/config"
cat >"$work/config/sidecache.yaml" <<YAML
version: 1
listen: 127.0.0.1:$proxy_port
admin: { listen: 127.0.0.1:$admin_port }
upstream: { url: "http://127.0.0.1:$origin_port" }
$store_yaml
${CALLGRIND_EXTRA:-}
routes:
  - name: app
    path: /api/tenants/{tenant}/apps/{id}
    params: { tenant: "[A-Za-z0-9_-]{1,64}", id: "[1-9][0-9]{0,17}" }
    ttl: 1h
  - name: object
    path: /object/{bytes}
    params: { bytes: "[0-9]{1,8}" }
    ttl: 1h
${CALLGRIND_OBJECT_KEYS:-}
fill: { max_body: 16MiB }
YAML
wait_http "http://127.0.0.1:$origin_port/healthz"
out=${CALLGRIND_OUT:-$work/callgrind.out}
if [[ ${CALLGRIND_SYSTEM:-sidecache} == nginx ]]; then
    command -v nginx >/dev/null || { echo "callgrind: needs nginx (apt-get install nginx-light)" >&2; exit 1; }
    mkdir -p "$work/nginx"
    user_line=''
    [[ $EUID -eq 0 ]] && user_line="user $(id -un) $(id -gn);"
    { echo "master_process off;"
      sed -e "s|@USER_LINE@|$user_line|" -e "s|@WORKERS@|1|" -e "s|@DIR@|$work/nginx|g" \
          -e "s|@PORT@|$proxy_port|" -e "s|@ORIGIN_PORT@|$origin_port|" \
          -e "s|@SLOW_ORIGIN_PORT@|$origin_port|" -e "s|@STAMPEDE_PORT@|$(port)|" \
          -e "s|@NOFILE@|1024|" -e "s|@WORKER_CONNECTIONS@|512|" -e "s|@LIMIT_BODY@|x|" \
          bench/nginx.conf.tmpl; } >"$work/nginx/nginx.conf"
    taskset -c 0 valgrind --tool=callgrind --callgrind-out-file="$out" \
        nginx -p "$work/nginx" -e "$work/nginx/error.log" -c "$work/nginx/nginx.conf" >"$work/nginx.log" 2>&1 &
    vg=$!
    pids+=("$vg")
    store=nginx
    wait_http "http://127.0.0.1:$proxy_port/healthz"
else
    SIDECACHE_LOG=warn taskset -c 0 valgrind --tool=callgrind --callgrind-out-file="$out" \
        "$sidecache_bin" run --config "$work/config/sidecache.yaml" >"$work/sidecache.log" 2>&1 &
    vg=$!
    pids+=("$vg")
    wait_http "http://127.0.0.1:$admin_port/readyz"
fi

send() {
    python3 - "$proxy_port" "$path" "$1" "$method" "$body_bytes" "$extra_header" "$want_status" <<'PY'
import http.client, sys
port, path, n = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
method, body_bytes = sys.argv[4], int(sys.argv[5])
header, want = sys.argv[6], int(sys.argv[7])
headers = dict([[p.strip() for p in header.split(":", 1)]]) if header else {}
body = b"x" * body_bytes if body_bytes else None
c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
for _ in range(n):
    c.request(method, path, body=body, headers=headers)
    r = c.getresponse()
    r.read()
    assert r.status == want, (r.status, want)
print(r.getheader("X-Cache"))
PY
}
send "$warmup" >/dev/null
callgrind_control -z "$vg" >/dev/null
cache=$(send "$requests")
callgrind_control -d "$vg" >/dev/null
sleep 1
# shellcheck disable=SC2012 # our own file names
dump=$(ls -t "$out"* | head -n 1)
total=$(callgrind_annotate "$dump" 2>/dev/null | awk '/PROGRAM TOTALS/ { gsub(",", "", $1); print $1; exit }')
echo "X-Cache of the last answer: $cache"
echo "instructions per request: $((total / requests)) ($total for $requests $method requests, store $store)"
callgrind_annotate --inclusive=yes "$dump" 2>/dev/null | sed -n '/^Ir/,$p' | head -n 60
