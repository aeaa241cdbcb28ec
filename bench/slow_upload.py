#!/usr/bin/env python3
"""Slow uploads (slowhttptest -B): what the origin holds and what a probe
client sees, with request bodies held by sidecache (the default) and with
`limits.request_buffer: 0` (every body streams, as before buffering).

    bench/slow_upload.py [SIDECACHE_BIN]

The origin is a small counting HTTP/1.1 server in this process: it counts a
request as in flight from its head to its answer, and records the peak.
Per mode: a probe of 200 GETs of a forwarded path (one new connection
each) on an idle proxy, then slowhttptest's slow-body attack (500
connections, each announcing an 8 KiB POST body and sending 24 bytes every
10 s, 40 s) on a forwarded path while the probe runs again. Printed: origin
peak concurrency, probe p50/p99 idle and under attack, and slowhttptest's
closing summary. Needs slowhttptest (apt-get install slowhttptest).
Loopback only; about 2 minutes per mode. See bench/README.md."""
import asyncio
import http.client
import os
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SIDECACHE = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "target/release/sidecache")
# Below the ephemeral range, like bench/run.sh.
SC_PORT, ADMIN_PORT, UP_PORT = 18580, 18590, 18570
CONNECTIONS, LENGTH_S = 500, 40


class Origin:
    """Counts requests in flight (head read to answer written)."""

    def __init__(self):
        self.inflight = 0
        self.peak = 0
        self.requests = 0

    async def serve(self, reader, writer):
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                self.requests += 1
                self.inflight += 1
                self.peak = max(self.peak, self.inflight)
                try:
                    length = 0
                    for line in head.split(b"\r\n"):
                        if line.lower().startswith(b"content-length:"):
                            length = int(line.split(b":", 1)[1])
                    if length:
                        await reader.readexactly(length)
                    writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
                    await writer.drain()
                finally:
                    self.inflight -= 1
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError):
            pass
        finally:
            writer.close()

    def reset(self):
        self.peak = self.inflight


origin = Origin()


def run_origin():
    async def main():
        server = await asyncio.start_server(origin.serve, "127.0.0.1", UP_PORT, backlog=4096)
        async with server:
            await server.serve_forever()

    asyncio.run(main())


threading.Thread(target=run_origin, daemon=True).start()


def probe(n=200, timeout=5.0):
    lat, fail = [], 0
    for _ in range(n):
        t = time.monotonic()
        try:
            c = http.client.HTTPConnection("127.0.0.1", SC_PORT, timeout=timeout)
            c.request("GET", "/probe")
            r = c.getresponse()
            r.read()
            c.close()
            if r.status != 200:
                fail += 1
                continue
            lat.append((time.monotonic() - t) * 1000)
        except Exception:
            fail += 1
        time.sleep(0.05)
    lat.sort()
    pct = lambda p: lat[min(len(lat) - 1, int(len(lat) * p))] if lat else float("nan")
    return pct(0.5), pct(0.99), fail


def run_mode(name, limits):
    tmp = tempfile.mkdtemp()
    cfg = os.path.join(tmp, "sc.yaml")
    open(cfg, "w").write(f"""version: 1
listen: 127.0.0.1:{SC_PORT}
admin: {{ listen: 127.0.0.1:{ADMIN_PORT} }}
upstream: {{ url: "http://127.0.0.1:{UP_PORT}" }}
limits: {{ {limits} }}
routes:
  - name: app
    path: /api/tenants/{{tenant}}/apps/{{id}}
    params: {{ tenant: "[a-z]+", id: "[1-9][0-9]*" }}
    ttl: 60s
""")
    # 4096 files: max_connections 2016, so the 500 attackers never put the
    # probe in the listen backlog (that is bench/hostile.py's subject).
    sc = subprocess.Popen(["bash", "-c", f"ulimit -n 4096; exec {SIDECACHE} run --config {cfg}"],
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        time.sleep(1.0)
        idle = probe()
        origin.reset()
        attack = subprocess.Popen(
            ["slowhttptest", "-B", "-c", str(CONNECTIONS), "-r", "200", "-i", "10", "-s", "8192",
             "-x", "24", "-t", "POST", "-l", str(LENGTH_S), "-u",
             f"http://127.0.0.1:{SC_PORT}/upload"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        time.sleep(5)  # the attack's connections are open (200/s)
        during = probe()
        out, _ = attack.communicate(timeout=LENGTH_S + 60)
        summary = [l.strip() for l in out.splitlines() if "closed" in l or "service available" in l]
        print(f"{name}: origin peak concurrency {origin.peak} (requests {origin.requests}); "
              f"probe p50/p99 idle {idle[0]:.2f}/{idle[1]:.2f} ms, under attack "
              f"{during[0]:.2f}/{during[1]:.2f} ms (p99 ratio {during[1] / idle[1]:.2f}), "
              f"probe failures {idle[2]}/{during[2]}")
        print("   slowhttptest:", summary[-2:] if summary else out[-300:])
    finally:
        sc.terminate()
        sc.wait()
        time.sleep(1.0)


run_mode("streamed (request_buffer: 0)", "request_buffer: 0")
run_mode("held (defaults)", "request_buffer: 1MiB")
