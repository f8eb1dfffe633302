"""`dart serve` within dart's HTTP limits (issue 54), the real command on loopback under a
256-descriptor limit: idle connections, half-sent heads and half-sent bodies never stop /health
from answering, and heads and bodies are closed by their deadlines; a web page (DNS rebinding, a
cross-site post) gets a 403."""

from __future__ import annotations

import os
import resource
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from dart.rollout.server import BODY_TIMEOUT_S
from dart.web.httplimits import ConnectionLimits
from tests.web.rebinding import ask, assert_refuses_web_pages

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
NOFILE = 256


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


@pytest.fixture(scope="module")
def serve(tiny_dir: Path) -> Iterator[tuple[subprocess.Popen[str], int]]:
    """`dart serve` of the tiny model on a free port, its descriptors limited to 256."""

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (NOFILE, NOFILE))

    proc = subprocess.Popen([sys.executable, "-m", "dart.cli", "serve", "--model", str(tiny_dir), "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, preexec_fn=limit,
                            env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # "dart serve: http://127.0.0.1:PORT/v1 (...)", once bound
        assert line.startswith("dart serve: http://127.0.0.1:"), line
        yield proc, int(line.split(":")[3].split("/")[0])
    finally:
        proc.terminate()
        proc.wait(30)


def test_dart_serve_refuses_dns_rebinding_and_cross_site_requests(serve) -> None:
    _, port = serve
    assert_refuses_web_pages(port, "/health")
    assert_refuses_web_pages(port, "/v1/models")
    assert_refuses_web_pages(port, "/v1/chat/completions", method="POST", body=b"{}",
                             headers={"Content-Type": "application/json"}, ok=400)


HALF_SENT = {
    "idle": b"",
    "head": b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ",
    "body": b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Content-Length: 99999\r\n\r\n{",
}
"""Connections that never finish a request: before issue 54, 250 idle or half-body ones stopped
/health (the server at its 256 descriptors; heads alone aiohttp closes itself)."""


def closed_by_server(s: socket.socket) -> bool:
    s.setblocking(False)
    try:
        return s.recv(1 << 16) == b""
    except BlockingIOError:
        return False
    except OSError:  # reset: aborted by the server
        return True


def test_half_sent_requests_never_stop_health_and_are_closed_by_their_deadline(serve) -> None:
    proc, port = serve
    base = open_fds(proc.pid)
    cap = NOFILE // 4  # descriptor_cap: a quarter of the limit, the rest for the process's own files
    socks: list[tuple[str, socket.socket]] = []
    answers = []
    try:
        for _ in range(6):  # 300 connections, more than the process has descriptors
            for i in range(50):
                kind = list(HALF_SENT)[i % 3]
                s = socket.create_connection(("127.0.0.1", port))
                s.send(HALF_SENT[kind])
                socks.append((kind, s))
            t0 = time.monotonic()
            status, body = ask(port, "/health", timeout_s=5)
            answers.append((status, round(time.monotonic() - t0, 3)))
            assert b'"ok": true' in body
            assert open_fds(proc.pid) - base <= cap + 2, open_fds(proc.pid) - base
        assert all(status == 200 and took < 2.0 for status, took in answers), answers
        # Every head and body still held is closed by its deadline (idle ones wait for theirs, 30 s).
        deadline = time.monotonic() + max(ConnectionLimits().header_timeout_s, BODY_TIMEOUT_S) + 5
        while time.monotonic() < deadline:
            held = [kind for kind, s in socks if kind != "idle" and not closed_by_server(s)]
            if not held:
                break
            time.sleep(0.5)
        assert held == []
        assert proc.poll() is None
    finally:
        for _, s in socks:
            s.close()
