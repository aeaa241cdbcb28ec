#!/usr/bin/env python3
"""Streamed fills: time to first and to last byte of a cold object behind a
slow origin, and peak RSS with many cold fills at once.

Runs two sidecache binaries in turn (`--before`, e.g. a build of an older
commit, and `--after`) against the same tiny origin in this script, which
sends each object's body at a fixed rate (default 1 MiB/s). For each binary:

- `ttfb`: N clients (1, then 20) ask for one cold 1 MiB object at once;
  reported: median time to the first body byte and to the last, over
  `--rounds` rounds (a new object each round);
- `rss`: `--fills` clients (default 200) each ask for a different cold
  object at once; reported: the process's peak RSS (VmHWM) after the run,
  against its RSS before.

Figures are meant as ratios between the two binaries in one run.

    bench/fill_stream.py --before /tmp/before/sidecache --after target/release/sidecache
"""

import argparse
import asyncio
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

CHUNK = 16 * 1024


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def origin(reader, writer, size, rate):
    """One connection: answers each request with `size` bytes at `rate`."""
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            if not head:
                return
            writer.write(
                b"HTTP/1.1 200 OK\r\ncache-control: max-age=600\r\n"
                b"content-length: %d\r\n\r\n" % size
            )
            sent, start = 0, time.monotonic()
            while sent < size:
                n = min(CHUNK, size - sent)
                writer.write(b"x" * n)
                await writer.drain()
                sent += n
                # Paced: `sent` bytes are due at start + sent / rate.
                delay = start + sent / rate - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
    except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
        # CancelledError: the run is over and the server closes its idle connections.
        pass
    finally:
        writer.close()


async def fetch(port, path):
    """(seconds to the first body byte, seconds to the last, bytes)."""
    start = time.monotonic()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(
        f"GET {path} HTTP/1.1\r\nhost: bench\r\nconnection: close\r\n\r\n".encode()
    )
    await writer.drain()
    head = await reader.readuntil(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    first, got = None, 0
    while True:
        data = await reader.read(64 * 1024)
        if not data:
            break
        if first is None:
            first = time.monotonic() - start
        got += len(data)
    writer.close()
    if status != 200:
        raise RuntimeError(f"{path}: status {status}")
    return first or 0.0, time.monotonic() - start, got


def rss_kib(pid, field):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def start_sidecache(binary, upstream_port, fills):
    port, admin = free_port(), free_port()
    cfg = tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False)
    cfg.write(
        f"""version: 1
listen: 127.0.0.1:{port}
admin: {{ listen: 127.0.0.1:{admin} }}
upstream: {{ url: "http://127.0.0.1:{upstream_port}", timeout: 60s }}
fill: {{ max_concurrency: {fills + 16}, max_queued: {fills + 16}, max_body: 1MiB }}
routes:
  - name: app
    path: /obj/{{id}}
    params: {{ id: "[0-9]+" }}
    ttl: 600s
    lease: 60s
    wait: 60s
"""
    )
    cfg.close()
    proc = subprocess.Popen(
        [binary, "--config", cfg.name],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    for _ in range(300):
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{admin}/readyz", timeout=1)
            return proc, port
        except OSError:
            time.sleep(0.1)
    proc.kill()
    sys.exit(f"{binary} did not become ready")


async def run(binary, args, origin_port, next_id):
    proc, port = start_sidecache(binary, origin_port, args.fills)
    out = {}
    try:
        for clients in (1, 20):
            firsts, lasts = [], []
            for _ in range(args.rounds):
                path = f"/obj/{next_id()}"
                got = await asyncio.gather(*(fetch(port, path) for _ in range(clients)))
                for first, last, n in got:
                    if n != args.size:
                        raise RuntimeError(f"{path}: {n} bytes")
                    firsts.append(first)
                    lasts.append(last)
            out[clients] = (statistics.median(firsts), statistics.median(lasts))
        before = rss_kib(proc.pid, "VmRSS")
        paths = [f"/obj/{next_id()}" for _ in range(args.fills)]
        await asyncio.gather(*(fetch(port, p) for p in paths))
        out["rss"] = (before, rss_kib(proc.pid, "VmHWM"))
    finally:
        proc.terminate()
        proc.wait()
    return out


async def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--before", required=True)
    p.add_argument("--after", required=True)
    p.add_argument("--size", type=int, default=1 << 20)
    p.add_argument("--rate", type=float, default=float(1 << 20), help="origin bytes/s")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--fills", type=int, default=200)
    args = p.parse_args()
    for b in (args.before, args.after):
        if not os.access(b, os.X_OK):
            sys.exit(f"not an executable: {b}")

    origin_port = free_port()
    server = await asyncio.start_server(
        lambda r, w: origin(r, w, args.size, args.rate), "127.0.0.1", origin_port
    )
    counter = iter(range(1, 1 << 30))
    results = {}
    async with server:
        for name, binary in (("before", args.before), ("after", args.after)):
            results[name] = await run(binary, args, origin_port, lambda: next(counter))

    print(f"object {args.size} B, origin {args.rate / (1 << 20):.2f} MiB/s, "
          f"median of {args.rounds} rounds")
    print("| clients | ttfb before | ttfb after | ratio | ttlb before | ttlb after | ratio |")
    print("|---|---|---|---|---|---|---|")
    for clients in (1, 20):
        (fb, lb), (fa, la) = results["before"][clients], results["after"][clients]
        print(f"| {clients} | {fb * 1000:.0f} ms | {fa * 1000:.0f} ms | {fa / fb:.3f} "
              f"| {lb * 1000:.0f} ms | {la * 1000:.0f} ms | {la / lb:.3f} |")
    (rb0, rb), (ra0, ra) = results["before"]["rss"], results["after"]["rss"]
    print(f"\npeak RSS with {args.fills} concurrent cold fills: before {rb} KiB "
          f"(idle {rb0}), after {ra} KiB (idle {ra0}); after/before {ra / rb:.3f}, "
          f"growth after/before {(ra - ra0) / max(1, rb - rb0):.3f}")


if __name__ == "__main__":
    asyncio.run(main())
