#!/usr/bin/env bash
# HTTP caching conformance (docs/testing.md#conformance): runs the public
# cache-tests suite (third-party, never copied into the repository) against
# sidecache and compares with the suite's published nginx and Varnish results.
#
#   tests/conformance/run.sh [--check] [--docs] [CONFIG...]
#
# CONFIG names a file tests/conformance/CONFIG.yaml (default: every such
# file). For each: copies the suite to target/conformance/ (once; `npm ci`
# there), starts the suite's origin server and sidecache (the debug binary,
# embedded store) with that config on free loopback ports, runs the suite
# through sidecache, and prints a summary per kind beside nginx and Varnish
# plus the failing required tests with the reasons in reasons.tsv.
#   --docs   rewrite docs/conformance.md from this run
#   --check  fail unless each config passes at least its floor of required
#            tests (tests/conformance/floors: "CONFIG N")
# Environment: CACHE_TESTS_DIR (default: cache-tests in a `shared` folder beside
# the project's, then /work/shared/cache-tests), SIDECACHE_BIN (default
# target/debug/sidecache, built if missing).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
root=$(pwd)
here=$root/tests/conformance
prog=conformance
die() { printf '%s: error: %s\n' "$prog" "$*" >&2; exit 1; }
note() { printf '%s: %s\n' "$prog" "$*" >&2; }

check=0 docs=0 configs=()
for a in "$@"; do
    case $a in
    --check) check=1 ;;
    --docs) docs=1 ;;
    -*) die "unknown option $a" ;;
    *) [[ -f $here/$a.yaml ]] || die "no config $here/$a.yaml"; configs+=("$a") ;;
    esac
done
if ((${#configs[@]} == 0)); then
    for f in "$here"/*.yaml; do configs+=("$(basename "$f" .yaml)"); done
fi

# The suite lives beside the project (docs/testing.md#conformance); a clone
# elsewhere on this machine finds it under /work/shared.
suite_src=${CACHE_TESTS_DIR:-}
if [[ -z $suite_src ]]; then
    for d in "$root/../shared/cache-tests" /work/shared/cache-tests; do
        [[ -f $d/package.json ]] && { suite_src=$d; break; }
    done
fi
[[ -n $suite_src && -f $suite_src/package.json && -d $suite_src/tests ]] ||
    die "the cache-tests suite is not at ${suite_src:-$root/../shared/cache-tests or /work/shared/cache-tests} (set CACHE_TESTS_DIR)"

# Node 18+ and npm: the suite is JavaScript.
node_ok() { command -v node >/dev/null && command -v npm >/dev/null &&
    (($(node -p 'process.versions.node.split(".")[0]') >= 18)); }
if ! node_ok; then
    if [[ $EUID -eq 0 ]] && command -v apt-get >/dev/null; then
        note "installing nodejs and npm with apt-get"
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends nodejs npm >/dev/null
    fi
    node_ok || die "the suite needs Node.js 18 or newer with npm"
fi

# The suite's copy, reinstalled when its sources change.
suite=$root/target/conformance/cache-tests
stamp=$(cd "$suite_src" && find package.json package-lock.json test-engine tests results -type f -print0 |
    sort -z | xargs -0 sha256sum | sha256sum | cut -d' ' -f1)
if [[ ! -f $suite/.stamp || $(cat "$suite/.stamp") != "$stamp" ]]; then
    note "copying the suite to $suite and installing its packages"
    rm -rf "$suite"
    mkdir -p "$suite"
    cp -r "$suite_src"/{package.json,package-lock.json,test-engine,tests,results} "$suite"/
    (cd "$suite" && npm ci --omit=dev --no-audit --no-fund --loglevel=error >/dev/null) ||
        die "npm ci failed in $suite"
    echo "$stamp" >"$suite/.stamp"
fi

bin=${SIDECACHE_BIN:-$root/target/debug/sidecache}
if [[ -z ${SIDECACHE_BIN:-} ]]; then
    cargo build --quiet --bin sidecache
fi
[[ -x $bin ]] || die "no sidecache binary at $bin"

work=$(mktemp -d "${TMPDIR:-/tmp}/sidecache-conformance.XXXXXX")
pids=()
cleanup() {
    local p
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
    rm -rf "$work"
}
trap cleanup EXIT

free_port() {
    local p i
    for ((i = 0; i < 200; i++)); do
        p=$((20000 + RANDOM % 12000))
        if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
            echo "$p"
            return
        fi
    done
    die "found no free loopback port"
}
# wait_port PID PORT LOG: until PORT accepts, while PID lives (30 s).
wait_port() {
    local i
    for ((i = 0; i < 300; i++)); do
        kill -0 "$1" 2>/dev/null || { tail -n 20 "$3" >&2; die "process exited (log: $3)"; }
        (exec 3<>"/dev/tcp/127.0.0.1/$2") 2>/dev/null && return 0
        sleep 0.1
    done
    die "nothing listens on port $2 after 30 s (log: $3)"
}

origin_port=$(free_port)
# The suite reads its settings from npm's environment variables.
(cd "$suite" && npm_config_port=$origin_port npm_config_protocol=http \
    npm_config_pidfile="$work/origin.pid" exec node test-engine/server/server.mjs) >"$work/origin.log" 2>&1 &
pids+=($!)
wait_port "$!" "$origin_port" "$work/origin.log"

runs=()
for c in "${configs[@]}"; do
    port=$(free_port)
    admin=$(free_port)
    while [[ $admin == "$port" ]]; do admin=$(free_port); done
    sed -e "s|@LISTEN@|127.0.0.1:$port|" -e "s|@ADMIN@|127.0.0.1:$admin|" \
        -e "s|@ORIGIN@|http://127.0.0.1:$origin_port|" "$here/$c.yaml" >"$work/$c.yaml"
    SIDECACHE_LOG=warn "$bin" run --config "$work/$c.yaml" >"$work/$c.log" 2>&1 &
    pid=$!
    pids+=("$pid")
    wait_port "$pid" "$port" "$work/$c.log"
    note "$c: running the suite through sidecache on port $port (about a minute)"
    (cd "$suite" && npm_config_base="http://127.0.0.1:$port" npm_package_config_id='' \
        node --no-warnings test-engine/cli.mjs) >"$work/$c.json" 2>"$work/$c.err" ||
        { tail -n 20 "$work/$c.err" >&2; die "the suite's client failed on $c"; }
    kill "$pid" 2>/dev/null || true
    mkdir -p "$root/target/conformance"
    cp "$work/$c.json" "$root/target/conformance/results-$c.json"
    runs+=("$c=$work/$c.json")
done

md_args=()
((docs)) && md_args=(--markdown "$root/docs/conformance.md")
node "$here/summarise.mjs" "$suite" "$here/reasons.tsv" "${runs[@]}" "${md_args[@]}" | tee "$work/summary.txt"

if ((check)); then
    failed=0
    while read -r _ name req _; do
        got=${req#required=}
        floor=$(awk -v c="$name" '$1 == c { print $2 }' "$here/floors")
        [[ -n $floor ]] || die "no floor for $name in $here/floors"
        if ((got < floor)); then
            note "$name: $got required tests passed, below the floor of $floor"
            failed=1
        else
            note "$name: $got required tests passed (floor $floor)"
        fi
    done < <(grep '^FLOOR ' "$work/summary.txt")
    ((failed == 0)) || exit 1
fi
