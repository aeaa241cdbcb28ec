#!/usr/bin/env bash
# bench/run.sh in two CPU layouts, one summary: the servers pinned to one
# core (wrk on another) and nothing pinned (what a sidecar in a Pod gets).
# On a 2-core machine "unpinned" is also the "2 cores" layout, so the
# summary's scaling column is each system's req/s on 2 cores over 1 core. On a machine with 4 or more CPUs the second
# layout pins the servers to CPUs 0-1 and wrk to the rest instead, so the
# scaling is not muddied by wrk, and a third, unpinned layout is added.
#
#   LAYOUT_SCENARIOS ["limit passthrough post hit limit_zipf hit_zipf"]  BENCH_SCENARIOS of each run
#   every other BENCH_* setting is passed to bench/run.sh as it is
set -euo pipefail
prog=bench-layouts
# shellcheck source=bench/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export BENCH_SCENARIOS=${LAYOUT_SCENARIOS:-limit passthrough post hit limit_zipf hit_zipf}

cpus=$(nproc)
names=(one_core)
envs=("BENCH_PIN=1 BENCH_SERVER_CPUS=0 BENCH_LOAD_CPUS=1")
if ((cpus >= 4)); then
    names+=(two_cores unpinned)
    envs+=("BENCH_PIN=1 BENCH_SERVER_CPUS=0-1 BENCH_LOAD_CPUS=2-$((cpus - 1))" "BENCH_PIN=0")
else
    names+=(unpinned)
    envs+=("BENCH_PIN=0")
fi

outs=()
for i in "${!names[@]}"; do
    note "layout ${names[i]}: ${envs[i]}"
    log=$(mktemp "${TMPDIR:-/tmp}/sidecache-layout.XXXXXX")
    # shellcheck disable=SC2086 # the layout's VAR=value words on purpose
    env ${envs[i]} bench/run.sh | tee "$log"
    out=$(sed -n 's/^raw numbers: //p' "$log")
    rm -f "$log"
    [[ -s $out ]] || die "bench/run.sh wrote no result file in layout ${names[i]}"
    outs+=("${names[i]}=$out")
    export BENCH_SKIP_BUILD=1 # built once
done

echo
python3 - "${outs[@]}" <<'PY'
import json, sys
layouts = [a.split("=", 1) for a in sys.argv[1:]]
data = {name: json.load(open(path)) for name, path in layouts}
names = [n for n, _ in layouts]
rps = {}
for name in names:
    for row in data[name]["summary"]:
        rps[(row["scenario"], row["system"], name)] = row["rps_mean"]
scenarios = []
for name in names:
    for row in data[name]["summary"]:
        if row["scenario"] not in scenarios:
            scenarios.append(row["scenario"])
base, wide = names[0], names[1]
print("req/s per layout (mean over rounds); scaling = %s / %s" % (wide, base))
print("%-12s %-10s" % ("scenario", "system") + "".join("%12s" % n for n in names) + "%10s" % "scaling")
for s in scenarios:
    for system in ("origin", "nginx", "sidecache"):
        vals = [rps.get((s, system, n)) for n in names]
        if all(v is None for v in vals):
            continue
        cells = "".join("%12s" % ("%.0f" % v if v is not None else "-") for v in vals)
        a, b = rps.get((s, system, base)), rps.get((s, system, wide))
        scale = "%.2f" % (b / a) if a and b else "-"
        print("%-12s %-10s%s%10s" % (s, system if not s.startswith("limit") else "nginx 200", cells, scale))
print()
print("sidecache / nginx req/s per layout (limit: / nginx `return 200`)")
print("%-12s" % "scenario" + "".join("%32s" % n for n in names))
for s in scenarios:
    if s.startswith("limit"):
        continue
    cells = []
    for n in names:
        r = data[n].get("sidecache_over_nginx", {}).get(s, {})
        text = "%.2f" % r["rps"] if "rps" in r else "-"
        if "rps_of_limit" in r:
            text += " (%.2f)" % r["rps_of_limit"]
        if "rps_of_limit_zipf" in r:
            text += " (Zipf limit %.2f)" % r["rps_of_limit_zipf"]
        cells.append("%32s" % text)
    print("%-12s" % s + "".join(cells))
print()
for n in names:
    print("%s targets:" % n)
    for t, v in data[n].get("targets", {}).items():
        print("  %-40s %-7s %s" % (t, v["status"], v["value"]))
print()
for n, path in layouts:
    print("raw numbers (%s): %s" % (n, path))
PY
