-- wrk request generator for bench/run.sh's range scenario: GETs of one
-- cached object of BENCH_RANGE_OBJECT_BYTES (default 1 MiB), each with a
-- single `Range` of BENCH_RANGE_BYTES (default 4 KiB) at an aligned offset
-- drawn uniformly, the same fixed-seed sequence for every system. Each
-- answer is a 206 cut from the cached 200. run.sh appends report.lua (the
-- done() reporter) to this file.
local object = tonumber(os.getenv("BENCH_RANGE_OBJECT_BYTES") or "1048576")
local size = tonumber(os.getenv("BENCH_RANGE_BYTES") or "4096")
local path = "/object/" .. object
local requests, n = {}, 0

init = function(args)
  n = math.floor(object / size)
  for k = 0, n - 1 do
    local first = k * size
    requests[k + 1] = wrk.format("GET", path, { Range = "bytes=" .. first .. "-" .. (first + size - 1) })
  end
  math.randomseed(42)
end

request = function()
  return requests[math.random(n)]
end
