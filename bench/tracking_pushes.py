#!/usr/bin/env python3
"""Invalidation pushes per invalidation: per-key tracking (what the near
cache uses, one tracked connection per node) against what `CLIENT TRACKING
ON BCAST PREFIX <ns>o:` would cost.

Starts its own redis-server (one node: a Cluster master behaves the same
for the keys of its slots), opens INSTANCES RESP3 connections with
tracking on (each stands for one sidecache instance's tracked connection),
lets each read (MGET entry, generation) HELD random objects of OBJECTS,
then applies INVALIDATIONS invalidations, each followed by the refill the
pipeline makes (lease taken, entry published, lease released: the key
writes of lease.lua, publish.lua and unlock), and counts the pushes all
instances received. Refills run on a separate connection, as a sidecache
instance takes leases over its shared (untracked) connection.

    bench/tracking_pushes.py [INSTANCES=10] [OBJECTS=1000] [HELD=100] [INVALIDATIONS=200]
"""
import os
import random
import socket
import subprocess
import sys
import tempfile
import time


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


class Conn:
    """A minimal RESP3 client: enough to send commands and count pushes."""

    def __init__(self, port):
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.buf = b""
        self.pushes = 0

    def send(self, *args):
        out = b"*%d\r\n" % len(args)
        for a in args:
            a = a if isinstance(a, bytes) else str(a).encode()
            out += b"$%d\r\n%s\r\n" % (len(a), a)
        self.sock.sendall(out)

    def line(self):
        while b"\r\n" not in self.buf:
            self.buf += self.sock.recv(65536)
        line, self.buf = self.buf.split(b"\r\n", 1)
        return line

    def exact(self, n):
        while len(self.buf) < n + 2:
            self.buf += self.sock.recv(65536)
        data, self.buf = self.buf[:n], self.buf[n + 2 :]
        return data

    def value(self):
        line = self.line()
        kind, rest = line[:1], line[1:]
        if kind in b"+-:_#,(":
            return rest
        if kind in b"$=!":
            n = int(rest)
            return None if n < 0 else self.exact(n)
        if kind in b"*~>":
            return [self.value() for _ in range(int(rest))]
        if kind == b"%":
            return [(self.value(), self.value()) for _ in range(int(rest))]
        raise ValueError(line)

    def reply(self):
        """The next reply, counting the pushes before it."""
        while True:
            while not self.buf:
                self.buf += self.sock.recv(65536)
            if self.buf[:1] == b">":
                self.value()
                self.pushes += 1
                continue
            return self.value()

    def call(self, *args):
        self.send(*args)
        return self.reply()

    def drain(self):
        """Counts pushes already sent: a PING's reply comes after them."""
        self.call("PING")


def keys(i):
    return f"cg:o:{{app:{i}}}:e:v3:", f"cg:o:{{app:{i}}}:g", f"cg:o:{{app:{i}}}:l:"


def run(port, mode, instances, objects, held, invalidations, seed):
    rng = random.Random(seed)
    writer = Conn(port)
    writer.call("FLUSHALL")
    for i in range(objects):
        e, g, _ = keys(i)
        writer.call("SET", g, "g0")
        writer.call("SET", e, "entry")
    conns = []
    for _ in range(instances):
        c = Conn(port)
        c.call("HELLO", "3")
        if mode == "bcast":
            c.call("CLIENT", "TRACKING", "ON", "BCAST", "PREFIX", "cg:o:")
        else:
            c.call("CLIENT", "TRACKING", "ON")
        c.holds = set(rng.sample(range(objects), held))
        for i in c.holds:
            e, g, _ = keys(i)
            c.call("MGET", e, g)
        conns.append(c)
    for c in conns:
        c.drain()
        c.pushes = 0
    holders = 0
    for n in range(invalidations):
        i = rng.randrange(objects)
        holders += sum(i in c.holds for c in conns)
        e, g, l = keys(i)
        writer.call("SET", g, f"g{n + 1}")  # invalidate.lua
        writer.call("SET", l, "owner", "NX", "PX", "30000")  # lease.lua
        writer.call("SET", e, f"entry{n + 1}")  # publish.lua
        writer.call("DEL", l)  # unlock
        # The instances that held it read it again (and are tracked again).
        for c in conns:
            if i in c.holds:
                c.call("MGET", e, g)
    for c in conns:
        c.drain()
    pushes = sum(c.pushes for c in conns)
    return pushes, holders


def main():
    args = [int(a) for a in sys.argv[1:]]
    instances, objects, held, invalidations = (args + [10, 1000, 100, 200][len(args):])[:4]
    port = free_port()
    work = tempfile.mkdtemp(prefix="tracking-pushes.")
    server = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
         "--appendonly", "no", "--dir", work],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        for _ in range(100):
            try:
                socket.create_connection(("127.0.0.1", port)).close()
                break
            except OSError:
                time.sleep(0.05)
        print(f"{instances} instances, {objects} objects, {held} held per instance, "
              f"{invalidations} invalidations (+ refill each)")
        for mode in ("per-key", "bcast"):
            pushes, holders = run(port, mode, instances, objects, held, invalidations, 1)
            print(f"{mode:8} pushes {pushes:6}  per invalidation {pushes / invalidations:6.2f}  "
                  f"(holders per invalidation {holders / invalidations:.2f})")
    finally:
        server.kill()
        server.wait()


if __name__ == "__main__":
    main()
