#!/usr/bin/env bash
# Where a request's time goes outside user space: system calls and context
# switches per request, for sidecache and nginx on the same origin, counted
# (not timed), so the figures hold on a busy machine.
#
# Starts the example origin, redis-server, sidecache (Redis store, near
# cache) and nginx (bench/nginx.conf.tmpl) on free loopback ports, unpinned.
# For each system and path it runs wrk for SYSCALLS_DURATION seconds while
# `strace -c -f` is attached to the server's processes, and prints per
# request: system calls by name (a run under strace, which slows the
# servers a lot: only its counts mean anything), and from a run without
# strace the server's user and system CPU time (/proc/PID/stat; noisy on a
# busy machine, but per request) and its voluntary and involuntary context
# switches (/proc/PID/task/*/status).
#
#   SYSCALLS_DURATION [5]    seconds per measurement
#   SYSCALLS_CONNECTIONS [32]  wrk connections (one wrk thread)
#   SYSCALLS_PATHS ["passthrough hit post"]  (post: a 1 KiB POST to /sink)
#   BENCH_SIDECACHE_RUNTIME  sidecache's server.runtime (multi_thread | per_core)
#   SIDECACHE_BIN, UPSTREAM_BIN, BENCH_SKIP_BUILD as in bench/run.sh
set -euo pipefail
unset DATABASE_URL
prog=bench-syscalls
# shellcheck source=bench/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$(dirname "${BASH_SOURCE[0]}")/.."
root=$(pwd)

duration=${SYSCALLS_DURATION:-5}
connections=${SYSCALLS_CONNECTIONS:-32}
read -r -a paths <<<"${SYSCALLS_PATHS:-passthrough hit post}"
sidecache_bin=${SIDECACHE_BIN:-$root/target/release/sidecache}
upstream_bin=${UPSTREAM_BIN:-$root/target/release/examples/upstream}
declare -A path_of=([passthrough]='/api/tenants/acme/apps?limit=1' [hit]='/api/tenants/acme/apps/1' [post]=/sink)
# post: a 1 KiB POST (bench/post.lua), forwarded by both proxies.
declare -A script_of=([post]=$root/bench/post.lua)

for tool in wrk curl strace nginx redis-server redis-cli; do
    command -v "$tool" >/dev/null || die "$tool not found (apt-get install wrk nginx-light strace redis-server)"
done
if [[ -z ${BENCH_SKIP_BUILD:-} ]]; then
    note "building release binaries"
    cargo build --release --locked --bin sidecache --example upstream
fi

work_dir syscalls
on_servers=()

origin_port=$(free_port)
start origin "$upstream_bin" --listen "127.0.0.1:$origin_port" --apps 100 --payload-bytes 1024
wait_until origin http_ok "http://127.0.0.1:$origin_port/healthz"
redis_port=$(free_port)
start redis redis-server --port "$redis_port" --bind 127.0.0.1 --save "" --appendonly no --dir "$work"
wait_until redis redis-cli -p "$redis_port" ping

sc_port=$(free_port)
admin_port=$(free_port)
mkdir -p "$work/config"
cat >"$work/config/sidecache.yaml" <<YAML
version: 1
listen: 127.0.0.1:$sc_port
admin: { listen: 127.0.0.1:$admin_port }
upstream: { url: "http://127.0.0.1:$origin_port" }
store: { namespace: "sys:", redis: { url: "redis://127.0.0.1:$redis_port/0" } }
${BENCH_SIDECACHE_RUNTIME:+server: { runtime: $BENCH_SIDECACHE_RUNTIME \}}
routes:
  - name: app
    path: /api/tenants/{tenant}/apps/{id}
    params: { tenant: "[A-Za-z0-9_-]{1,64}", id: "[1-9][0-9]{0,17}" }
    ttl: 1h
YAML
SIDECACHE_LOG=warn start sidecache "$sidecache_bin" run --config "$work/config/sidecache.yaml"
wait_until sidecache http_ok "http://127.0.0.1:$admin_port/readyz"

nginx_port=$(free_port)
start_nginx auto "$nginx_port" "$origin_port" "$origin_port" "$(free_port)" 1024
wait_until nginx http_ok "http://127.0.0.1:$nginx_port/api/tenants/acme/apps/1"
declare -A port_of=([sidecache]=$sc_port [nginx]=$nginx_port)

# pids_of NAME: the server's processes (nginx: its workers, which serve).
pids_of() {
    case $1 in
        nginx) pgrep -P "${pid_of[nginx]}" | paste -sd, ;;
        *) echo "${pid_of[$1]}" ;;
    esac
}
# cpu PIDS: user and system CPU time in clock ticks, all threads.
cpu() {
    local p
    for p in ${1//,/ }; do cat /proc/"$p"/stat; done |
        awk '{ sub(/^.*\) /, ""); u += $12; s += $13 } END { print u + 0, s + 0 }'
}
hz=$(getconf CLK_TCK)
# switches PIDS: voluntary and involuntary context switches, all threads.
switches() {
    local p
    for p in ${1//,/ }; do cat /proc/"$p"/task/*/status; done |
        awk '/^voluntary_ctxt_switches/ { v += $2 } /^nonvoluntary_ctxt_switches/ { n += $2 } END { print v + 0, n + 0 }'
}

for path in "${paths[@]}"; do
    for system in nginx sidecache; do
        url="http://127.0.0.1:${port_of[$system]}${path_of[$path]}"
        script=()
        if [[ -n ${script_of[$path]:-} ]]; then
            script=(-s "${script_of[$path]}")
            curl -fsS -o /dev/null --data-binary x "$url"
        else
            curl -fsS -o /dev/null "$url"
            curl -fsS -o /dev/null "$url" # the second read of `hit` is a hit
        fi
        pids=$(pids_of "$system")
        # Context switches from a run without strace (ptrace stops are
        # switches of their own), syscalls from a second run under strace.
        read -r v0 n0 < <(switches "$pids")
        read -r u0 s0 < <(cpu "$pids")
        wrk -t1 -c"$connections" -d"${duration}s" "${script[@]}" "$url" >"$work/wrk.txt"
        read -r v1 n1 < <(switches "$pids")
        read -r u1 s1 < <(cpu "$pids")
        plain=$(awk '/requests in/ { print $1 }' "$work/wrk.txt")
        ((plain > 0)) || die "wrk completed no request against $system"
        strace -c -f -o "$work/strace.txt" -p "$pids" 2>/dev/null &
        tracer=$!
        sleep 0.5 # strace attaches; nothing is measured before wrk starts
        wrk -t1 -c"$connections" -d"${duration}s" "${script[@]}" "$url" >"$work/wrk.txt"
        kill -INT "$tracer"
        wait "$tracer" || true
        requests=$(awk '/requests in/ { print $1 }' "$work/wrk.txt")
        ((requests > 0)) || die "wrk completed no request against $system under strace"
        printf '\n%s %s (%s requests): CPU per request %.2f us user, %.2f us system; context switches per request %.2f voluntary, %.2f involuntary\n' \
            "$system" "$path" "$plain" "$(bc -l <<<"($u1 - $u0) * 1000000 / $hz / $plain")" "$(bc -l <<<"($s1 - $s0) * 1000000 / $hz / $plain")" \
            "$(bc -l <<<"($v1 - $v0) / $plain")" "$(bc -l <<<"($n1 - $n0) / $plain")"
        printf '  syscalls per request (%s requests under strace):\n' "$requests"
        awk -v n="$requests" '
            /^------/ { table = !table; next }
            table && NF >= 5 { total += $4; rows[$NF] = $4 }  # $4: calls
            END { printf "  %-16s %8.2f\n", "all syscalls", total / n
                  for (s in rows) if (rows[s] / n >= 0.01) printf "  %-16s %8.2f\n", s, rows[s] / n }' "$work/strace.txt" |
            sort -k2 -rn
    done
done
