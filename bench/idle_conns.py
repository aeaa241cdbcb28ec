#!/usr/bin/env python3
"""Idle keep-alive client for bench/run.sh.

Opens N HTTP/1.1 keep-alive connections to HOST:PORT, sends one GET of PATH
on each, reads each complete answer (Content-Length framing), prints
"READY <ok> <failed>" and then holds every connection open until stdin
closes (or it is killed). The server's RSS is sampled by run.sh before and
while the connections are held.

usage: idle_conns.py N HOST PORT PATH
"""
import resource
import socket
import sys


def read_answer(s):
    buf = b""
    while b"\r\n\r\n" not in buf:
        chunk = s.recv(65536)
        if not chunk:
            return False
        buf += chunk
    head, _, body = buf.partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value.strip())
    while len(body) < length:
        chunk = s.recv(65536)
        if not chunk:
            return False
        body += chunk
    return head.startswith(b"HTTP/1.1 200")


def main():
    n, host, port, path = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4]
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    request = f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n".encode()
    socks, failed = [], 0
    for _ in range(n):
        try:
            s = socket.create_connection((host, port), timeout=30)
            s.sendall(request)
            socks.append(s)
        except OSError:
            failed += 1
    ok = 0
    for s in socks:
        try:
            ok += read_answer(s)
        except OSError:
            pass
    print(f"READY {ok} {n - ok}", flush=True)
    sys.stdin.read()


if __name__ == "__main__":
    main()
