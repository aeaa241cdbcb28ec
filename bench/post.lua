-- wrk request for bench/run.sh's post scenario: an uncached POST with a
-- BENCH_POST_BYTES body (default 1024) to the origin's /sink, which reads
-- and drops it. run.sh appends report.lua (the done() reporter).
wrk.method = "POST"
wrk.body = string.rep("p", tonumber(os.getenv("BENCH_POST_BYTES") or "1024"))
wrk.headers["Content-Type"] = "application/octet-stream"
