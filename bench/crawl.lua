-- wrk request generator for bench/embedded_store.sh: walks
-- BENCH_CRAWL_IDS distinct objects once each, in order, then stops (set
-- -d longer than the walk takes). Object i (1-based) is
-- /api/tenants/<acme|globex>/apps/<BENCH_CRAWL_OFFSET + ceil(i / 2)>: odd i
-- -> acme, even i -> globex (bench/zipf.lua's numbering, shifted), so the
-- origin needs --apps >= BENCH_CRAWL_OFFSET + BENCH_CRAWL_IDS / 2. Run it
-- with one wrk thread (-t1): the counters live in the thread. Requests sent
-- after the last id go to /healthz, which no cache route covers (answers
-- without X-Cache, counted apart). bench/xcache.lua is appended to count
-- answers; once every id has been answered the thread stops and writes
-- BENCH_CRAWL_DONE (a file name), and the caller sends wrk SIGINT (wrk's
-- main thread otherwise sleeps out -d).
local n = tonumber(os.getenv("BENCH_CRAWL_IDS") or "1000000")
local offset = tonumber(os.getenv("BENCH_CRAWL_OFFSET") or "0")
local done_file = os.getenv("BENCH_CRAWL_DONE")
local i, answered, responses = 0, 0, 0
local tail

request = function()
  i = i + 1
  if i > n then
    -- Built here, not at load time, when wrk.headers has its Host.
    tail = tail or wrk.format("GET", "/healthz")
    return tail
  end
  local tenant = (i % 2 == 1) and "acme" or "globex"
  return wrk.format("GET", "/api/tenants/" .. tenant .. "/apps/" .. (offset + math.ceil(i / 2)))
end

-- Called by xcache.lua's response(); cached: the answer carried X-Cache
-- (an id, not a /healthz).
-- Also ends 1 000 answers past n whatever they were (an id answered
-- without X-Cache must not keep the run going).
crawl_done = function(cached)
  responses = responses + 1
  if cached then
    answered = answered + 1
  end
  if answered == n or responses == n + 1000 then
    if done_file then
      local f = io.open(done_file, "w")
      f:write("done\n")
      f:close()
    end
    wrk.thread:stop()
  end
end
