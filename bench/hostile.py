#!/usr/bin/env python3
"""Hostile clients that hold connections: what they cost sidecache (CPU
share, RSS growth) and what a well-behaved probe client sees meanwhile (p99
latency, failures within 5 s, one new connection per request).

    bench/hostile.py [BIN_DIR] [FD_LIMIT]

BIN_DIR holds `sidecache` and `upstream` (default target/release and
target/release/examples); sidecache runs with `ulimit -n FD_LIMIT` (default
1024, where `limits.max_connections` defaults to 480). Loopback only; every
run is bounded (three attacks of about 10 s). See bench/README.md."""
import http.client
import os
import socket
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = sys.argv[1] if len(sys.argv) > 1 else None
FD_LIMIT = int(sys.argv[2]) if len(sys.argv) > 2 else 1024
SIDECACHE = os.path.join(BIN, "sidecache") if BIN else os.path.join(ROOT, "target/release/sidecache")
UPSTREAM = os.path.join(BIN, "upstream") if BIN else os.path.join(ROOT, "target/release/examples/upstream")
# Below the ephemeral range, like bench/run.sh.
SC_PORT, ADMIN_PORT, UP_PORT = 18480, 18490, 18470
tmp = tempfile.mkdtemp()
cfg = os.path.join(tmp, "sc.yaml")
open(cfg, "w").write(f"""version: 1
listen: 127.0.0.1:{SC_PORT}
admin: {{ listen: 127.0.0.1:{ADMIN_PORT} }}
upstream: {{ url: "http://127.0.0.1:{UP_PORT}" }}
routes:
  - name: app
    path: /api/tenants/{{tenant}}/apps/{{id}}
    params: {{ tenant: "[a-z]+", id: "[1-9][0-9]*" }}
    ttl: 60s
""")
up = subprocess.Popen([UPSTREAM, "--listen", f"127.0.0.1:{UP_PORT}"],
                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
sc = subprocess.Popen(["bash", "-c", f"ulimit -n {FD_LIMIT}; exec {SIDECACHE} run --config {cfg}"],
                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
time.sleep(1.0)

def proc(field):
    for line in open(f"/proc/{sc.pid}/status"):
        if line.startswith(field):
            return int(line.split()[1])

def cpu_ticks():
    parts = open(f"/proc/{sc.pid}/stat").read().rsplit(")", 1)[1].split()
    return int(parts[11]) + int(parts[12])

def probe(n=100, timeout=5.0):
    lat, fail = [], 0
    for _ in range(n):
        t = time.monotonic()
        try:
            c = http.client.HTTPConnection("127.0.0.1", SC_PORT, timeout=timeout)
            c.request("GET", "/api/tenants/acme/apps/1")
            r = c.getresponse(); r.read(); c.close()
            if r.status != 200:
                fail += 1
        except Exception:
            fail += 1
        lat.append(time.monotonic() - t)
    lat.sort()
    return lat[int(len(lat) * 0.99) - 1], fail

def attack(name, n, payload, window=8.0):
    socks = []
    rss0 = proc("VmRSS:")
    for _ in range(n):
        s = socket.socket()
        s.setblocking(False)
        try:
            s.connect(("127.0.0.1", SC_PORT))
        except BlockingIOError:
            pass
        socks.append(s)
    time.sleep(0.5)
    for s in socks:
        try:
            s.setblocking(True); s.settimeout(0.2)
            s.sendall(payload)
        except Exception:
            pass
    ticks0, t0 = cpu_ticks(), time.monotonic()
    p99, fail = probe(50)
    rest = window - (time.monotonic() - t0)
    if rest > 0:
        time.sleep(rest)
    cpu = (cpu_ticks() - ticks0) / os.sysconf("SC_CLK_TCK") / (time.monotonic() - t0)
    rss = proc("VmRSS:") - rss0
    print(f"{name:34s} conns {n:5d}  cpu {cpu*100:5.1f}% of a core  rss +{rss/1024:6.1f} MiB  "
          f"probe p99 {p99*1000:7.1f} ms  probe failures {fail}/50")
    for s in socks:
        s.close()
    time.sleep(1.0)

try:
    probe(20)
    base, fail = probe(100)
    print(f"baseline probe p99 {base*1000:.1f} ms, failures {fail}/100 (fd limit {FD_LIMIT})")
    preface = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
    settings = b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"
    attack("row 3: idle h2c (preface+SETTINGS)", 1100, preface + settings)
    head = b"GET /x HTTP/1.1\r\nHost: a\r\nX-Pad: " + b"a" * 400_000
    attack("row 4: 400 KB unfinished heads", 1000, head)
    attack("row 5: 20 bytes of the preface", 2000, preface[:20])
finally:
    sc.kill(); up.kill()
