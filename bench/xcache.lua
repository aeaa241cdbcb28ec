-- Appended by bench/embedded_store.sh to a wrk request generator
-- (bench/zipf.lua, bench/crawl.lua): counts answers by X-Cache value and
-- status class and prints one line after the run:
--   XCACHE hit=.. miss=.. negative=.. stale=.. other=.. none=.. s2xx=.. s3xx=.. s4xx=.. s5xx=..
-- (`none`: no X-Cache header, i.e. a path no cache route covers). With
-- BENCH_DELAY_MS > 0 every connection pauses that long before each request
-- (a paced load). Also calls crawl_done(had_x_cache) after each answer
-- when the generator defines it.
local threads = {}
local pause = tonumber(os.getenv("BENCH_DELAY_MS") or "0")

setup = function(thread)
  table.insert(threads, thread)
end

c_hit, c_miss, c_negative, c_stale, c_other, c_none = 0, 0, 0, 0, 0, 0
c_2, c_3, c_4, c_5 = 0, 0, 0, 0

if pause > 0 then
  delay = function()
    return pause
  end
end

response = function(status, headers, body)
  local x = headers["x-cache"] or headers["X-Cache"]
  if x == nil then
    c_none = c_none + 1
  elseif x == "HIT" then
    c_hit = c_hit + 1
  elseif x == "MISS" then
    c_miss = c_miss + 1
  elseif x == "NEGATIVE" then
    c_negative = c_negative + 1
  elseif x == "STALE" then
    c_stale = c_stale + 1
  else
    c_other = c_other + 1
  end
  if status >= 500 then
    c_5 = c_5 + 1
  elseif status >= 400 then
    c_4 = c_4 + 1
  elseif status >= 300 then
    c_3 = c_3 + 1
  else
    c_2 = c_2 + 1
  end
  if crawl_done then
    crawl_done(x ~= nil)
  end
end

done = function(summary, latency, requests)
  local names = { "c_hit", "c_miss", "c_negative", "c_stale", "c_other", "c_none", "c_2", "c_3", "c_4", "c_5" }
  local total = {}
  for _, name in ipairs(names) do
    total[name] = 0
    for _, t in ipairs(threads) do
      total[name] = total[name] + (t:get(name) or 0)
    end
  end
  io.write(string.format(
    "XCACHE hit=%d miss=%d negative=%d stale=%d other=%d none=%d s2xx=%d s3xx=%d s4xx=%d s5xx=%d "
      .. "requests=%d duration_us=%d err_connect=%d err_read=%d err_write=%d err_timeout=%d\n",
    total.c_hit, total.c_miss, total.c_negative, total.c_stale, total.c_other, total.c_none,
    total.c_2, total.c_3, total.c_4, total.c_5, summary.requests, summary.duration,
    summary.errors.connect, summary.errors.read, summary.errors.write, summary.errors.timeout))
end
