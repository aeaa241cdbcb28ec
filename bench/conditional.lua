-- wrk request for bench/run.sh's conditional scenario: a client that
-- already holds the current version revalidates it. Every GET of the cached
-- object carries If-None-Match with the object's current ETag (BENCH_ETAG,
-- read by run.sh from the system's own answer), so each answer is a 304
-- from the cache without a body. run.sh appends report.lua (the done()
-- reporter) to this file.
local etag = os.getenv("BENCH_ETAG")
if etag == nil or etag == "" then
  error("BENCH_ETAG is not set")
end
wrk.headers["If-None-Match"] = etag
