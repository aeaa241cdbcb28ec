-- wrk request generator for bench/run.sh's hit_zipf scenario: GETs spread
-- over BENCH_HOT_OBJECTS objects with a Zipf-like (s = 1) popularity, the
-- same fixed-seed sequence for every system. Object i (1-based) is
-- /api/tenants/<acme|globex>/apps/<id>: odd i -> acme, even i -> globex,
-- id = ceil(i / 2), so 10 000 objects need an origin with --apps 5000.
-- BENCH_ZIPF_PREFIX goes before every path (limit_zipf: "/__limit", where
-- nginx answers `return 200`). run.sh appends report.lua (the done()
-- reporter) to this file.
local n = tonumber(os.getenv("BENCH_HOT_OBJECTS") or "10000")
local prefix = os.getenv("BENCH_ZIPF_PREFIX") or ""
local cdf, requests = {}, {}

init = function(args)
  local h = 0
  for k = 1, n do
    h = h + 1 / k
    cdf[k] = h
  end
  for k = 1, n do
    cdf[k] = cdf[k] / h
    local tenant = (k % 2 == 1) and "acme" or "globex"
    requests[k] = wrk.format("GET", prefix .. "/api/tenants/" .. tenant .. "/apps/" .. math.ceil(k / 2))
  end
  math.randomseed(42)
end

request = function()
  local r, lo, hi = math.random(), 1, n
  while lo < hi do
    local mid = math.floor((lo + hi) / 2)
    if cdf[mid] < r then lo = mid + 1 else hi = mid end
  end
  return requests[lo]
end
