#!/usr/bin/env python3
"""Stampede client for bench/run.sh.

For each path in turn, CLIENTS threads (each with its own keep-alive
connection, spread round-robin over the BASE URLs) wait on a barrier and
then send one GET of that path at the same moment: CLIENTS concurrent cold
requests per key. Prints one JSON object: requests, statuses, X-Cache
values, and latency percentiles in milliseconds. The origin-side count
(requests per key) is measured by run.sh around this run.

usage: stampede.py CLIENTS BASE[,BASE...] PATH...
"""
import http.client
import json
import sys
import threading
import time
from collections import Counter
from urllib.parse import urlsplit


def main():
    clients = int(sys.argv[1])
    bases = [urlsplit(b) for b in sys.argv[2].split(",")]
    paths = sys.argv[3:]
    barrier = threading.Barrier(clients)
    lock = threading.Lock()
    statuses, caches, latencies = Counter(), Counter(), []

    def connect(i):
        u = bases[i % len(bases)]
        return http.client.HTTPConnection(u.hostname, u.port, timeout=30)

    def worker(i):
        conn = connect(i)
        try:  # open the keep-alive connection before the first key
            conn.request("GET", "/healthz")
            conn.getresponse().read()
        except OSError:
            conn.close()
            conn = connect(i)
        mine = []
        for path in paths:
            barrier.wait()
            t0 = time.perf_counter()
            try:
                conn.request("GET", path)
                r = conn.getresponse()
                r.read()
                status, cache = str(r.status), r.getheader("X-Cache", "-")
            except (OSError, http.client.HTTPException) as e:
                status, cache = "error:" + type(e).__name__, "-"
                conn.close()
                conn = connect(i)
            mine.append((status, cache, time.perf_counter() - t0))
        with lock:
            for status, cache, dt in mine:
                statuses[status] += 1
                caches[cache] += 1
                latencies.append(dt * 1000)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    latencies.sort()

    def pct(p):
        return round(latencies[min(len(latencies) - 1, int(len(latencies) * p / 100))], 2)

    print(json.dumps({
        "keys": len(paths), "clients": clients, "requests": len(latencies),
        "statuses": statuses, "x_cache": caches,
        "p50_ms": pct(50), "p99_ms": pct(99), "max_ms": round(latencies[-1], 2),
    }))


if __name__ == "__main__":
    main()
