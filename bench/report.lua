-- wrk reporter for bench/run.sh: prints one machine-readable line after the
-- run. Latencies are microseconds from wrk's own histogram (corrected for
-- nothing: wrk measures closed-loop, so p99 is the latency seen at the
-- throughput reached, not at a fixed offered rate).
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    "BENCH_RESULT requests=%d duration_us=%d bytes=%d p50_us=%.0f p90_us=%.0f p99_us=%.0f max_us=%.0f mean_us=%.1f "
      .. "err_connect=%d err_read=%d err_write=%d err_timeout=%d err_status=%d\n",
    summary.requests, summary.duration, summary.bytes,
    latency:percentile(50), latency:percentile(90), latency:percentile(99), latency.max, latency.mean,
    e.connect, e.read, e.write, e.timeout, e.status))
end
