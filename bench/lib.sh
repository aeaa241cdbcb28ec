# shellcheck shell=bash disable=SC2154
# Shared helpers of the benchmark scripts (sourced, not run). The caller
# sets `prog` (message prefix), calls `work_dir` (its temp dir `work` and
# the `pid_of` table of the processes it starts), and may set `on_servers`
# (a command prefix such as `taskset -c 0`) before calling `start`.

die() { printf '%s: error: %s\n' "$prog" "$*" >&2; exit 1; }
note() { printf '%s: %s\n' "$prog" "$*" >&2; }

declare -A taken=()
# free_port: a loopback port nobody listens on and this run has not taken.
free_port() {
    local p i
    for ((i = 0; i < 200; i++)); do
        # Below Linux's ephemeral range (32768-60999 by default): the idle
        # scenario leaves thousands of client ports there in TIME_WAIT, and
        # a server must not be handed one of them.
        p=$((20000 + RANDOM % 12000))
        [[ -n ${taken[$p]:-} ]] && continue
        if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
            taken[$p]=1
            echo "$p"
            return
        fi
    done
    die "found no free loopback port"
}

# start NAME CMD...: runs CMD in the background (behind `on_servers`, if
# set), logging to $work/NAME.log.
start() {
    local name=$1
    shift
    "${on_servers[@]}" "$@" >"$work/$name.log" 2>&1 &
    pid_of["$name"]=$!
}

# alive NAME: fails with the tail of NAME's log if it has exited.
alive() {
    if ! kill -0 "${pid_of[$1]}" 2>/dev/null; then
        tail -n 20 "$work/$1.log" >&2 || true
        die "$1 exited (log: $work/$1.log, tail above)"
    fi
}

# wait_until NAME CMD...: retries CMD for up to 30 s while NAME is alive.
wait_until() {
    local name=$1 i
    shift
    for ((i = 0; i < 300; i++)); do
        alive "$name"
        "$@" >/dev/null 2>&1 && return 0
        sleep 0.1
    done
    tail -n 20 "$work/$name.log" >&2 || true
    die "$name did not become ready within 30 s (log: $work/$name.log)"
}

http_ok() { curl -fsS -o /dev/null --max-time 1 "$1"; }

# work_dir NAME [KEEP_VAR]: creates the run's temp dir ($work) and an empty
# `pid_of`; on exit, INT or TERM every process `start`ed is stopped and
# $work removed, unless the variable KEEP_VAR (default BENCH_KEEP) is set.
# A script with more to stop defines `extra_cleanup` (run after the kills,
# before the waits).
work_dir() {
    work=$(mktemp -d "${TMPDIR:-/tmp}/sidecache-$1.XXXXXX")
    declare -gA pid_of=()
    keep_var=${2:-BENCH_KEEP}
    trap cleanup EXIT
    trap 'exit 130' INT
    trap 'exit 143' TERM
}

# shellcheck disable=SC2317 # invoked by the EXIT trap
cleanup() {
    local name
    for name in "${!pid_of[@]}"; do kill "${pid_of[$name]}" 2>/dev/null || true; done
    if declare -F extra_cleanup >/dev/null; then extra_cleanup; fi
    for name in "${!pid_of[@]}"; do wait "${pid_of[$name]}" 2>/dev/null || true; done
    if [[ -n ${!keep_var:-} ]]; then note "kept $work"; else rm -rf "$work"; fi
}

# stop_postmaster DATA_DIR: fast shutdown of the Postgres whose data dir
# this is, by its pid file (runuser may have forked the postmaster, so the
# pid `start` recorded is not always it).
stop_postmaster() {
    local pid
    if [[ -f $1/postmaster.pid ]]; then
        pid=$(head -n 1 "$1/postmaster.pid")
        if [[ $pid =~ ^[0-9]+$ ]]; then kill -INT "$pid" 2>/dev/null || true; fi
    fi
}

# start_nginx WORKERS PORT ORIGIN_PORT SLOW_ORIGIN_PORT STAMPEDE_PORT BODY_BYTES:
# renders bench/nginx.conf.tmpl into $work/nginx (worker_processes WORKERS,
# the `limit` location answering BODY_BYTES), checks it and starts nginx as
# process `nginx`. Needs `root` (the checkout) and `nginx_bin`, if set.
start_nginx() {
    local user_line='' bin=${nginx_bin:-nginx}
    mkdir -p "$work/nginx"
    # As root, nginx would switch its workers to `nobody`, who cannot enter
    # the temp dir; keep them as the invoking user instead.
    [[ $EUID -eq 0 ]] && user_line="user $(id -un) $(id -gn);"
    sed -e "s|@USER_LINE@|$user_line|" -e "s|@WORKERS@|$1|" \
        -e "s|@DIR@|$work/nginx|g" -e "s|@PORT@|$2|" \
        -e "s|@ORIGIN_PORT@|$3|" -e "s|@SLOW_ORIGIN_PORT@|$4|" \
        -e "s|@STAMPEDE_PORT@|$5|" -e "s|@NOFILE@|$(ulimit -n)|" \
        -e "s|@WORKER_CONNECTIONS@|$(($(ulimit -n) - 100))|" \
        -e "s|@LIMIT_BODY@|$(printf '%*s' "$6" '' | tr ' ' x)|" \
        "$root/bench/nginx.conf.tmpl" >"$work/nginx/nginx.conf"
    "$bin" -t -q -p "$work/nginx" -e "$work/nginx/error.log" -c "$work/nginx/nginx.conf" ||
        die "nginx rejected the generated config $work/nginx/nginx.conf"
    start nginx "$bin" -p "$work/nginx" -e "$work/nginx/error.log" -c "$work/nginx/nginx.conf"
}

# install_missing PKG...: installs the Debian packages with apt-get when
# running as root, else stops naming them. Nothing to do without arguments.
install_missing() {
    (($# > 0)) || return 0
    if [[ $EUID -eq 0 ]] && command -v apt-get >/dev/null; then
        note "installing $* with apt-get"
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >/dev/null
    else
        die "missing $*; install with: sudo apt-get install -y $*"
    fi
}
