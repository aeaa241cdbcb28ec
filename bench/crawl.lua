-- wrk request generator for bench/embedded_store.sh: walks
-- BENCH_CRAWL_IDS distinct objects once each, in order, then stops (set
-- -d longer than the walk takes). Object i (1-based) is
-- /api/tenants/<acme|globex>/apps/<BENCH_CRAWL_OFFSET + ceil(i / 2)>: odd i
-- -> acme, even i -> globex (bench/zipf.lua's numbering, shifted), so the
-- origin needs --apps >= BENCH_CRAWL_OFFSET + BENCH_CRAWL_IDS / 2. Run it
-- with one wrk thread (-t1): the counter lives in the thread. Requests sent
-- after the last id (one per connection still in flight) go to /healthz,
-- which no cache route covers, and are counted apart. bench/xcache.lua is
-- appended to count answers.
local n = tonumber(os.getenv("BENCH_CRAWL_IDS") or "1000000")
local offset = tonumber(os.getenv("BENCH_CRAWL_OFFSET") or "0")
local i = 0
local tail = wrk.format("GET", "/healthz")

request = function()
  i = i + 1
  if i > n then
    return tail
  end
  local tenant = (i % 2 == 1) and "acme" or "globex"
  return wrk.format("GET", "/api/tenants/" .. tenant .. "/apps/" .. (offset + math.ceil(i / 2)))
end

crawl_done = function()
  if i >= n then
    wrk.thread:stop()
  end
end
