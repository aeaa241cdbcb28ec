-- wrk script for bench/penetration.sh: a flood of ids that do not exist.
--
-- Every request asks for /api/tenants/<tenant>/apps/<id> with a random id
-- drawn from [10^13, 10^15): never one of the catalogue's ids (1..N, N far
-- smaller), and so many that repeats are rare, so sidecache's negative
-- cache cannot absorb the flood by itself (only the Bloom filter can).
-- Each wrk thread has its own Lua state; `setup` gives each a distinct
-- seed. Prints one machine-readable line at the end.

local tenant = os.getenv("PEN_TENANT") or "acme"
local next_seed = 1

function setup(thread)
  thread:set("seed", next_seed)
  next_seed = next_seed + 1
end

function init(args)
  math.randomseed(os.time() * 1000 + (seed or 0) * 7919)
end

function request()
  local id = string.format("%d%09d", math.random(10000, 999999), math.random(0, 999999999))
  return wrk.format("GET", "/api/tenants/" .. tenant .. "/apps/" .. id)
end

done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    "PEN_RESULT requests=%d duration_us=%d p50_us=%.0f p99_us=%.0f "
      .. "err_connect=%d err_read=%d err_write=%d err_timeout=%d non_2xx=%d\n",
    summary.requests, summary.duration, latency:percentile(50), latency:percentile(99),
    e.connect, e.read, e.write, e.timeout, e.status))
end
