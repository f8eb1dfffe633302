"""`dart serve` within dart's HTTP limits (issue 54), the real command on loopback under a
256-descriptor limit: half-sent request heads never stop /health from answering and are closed
by their deadline; a web page (DNS rebinding, a cross-site post) gets a 403."""

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


def test_half_sent_heads_never_stop_health_and_are_closed_by_their_deadline(serve) -> None:
    proc, port = serve
    base = open_fds(proc.pid)
    cap = NOFILE // 4  # descriptor_cap: a quarter of the limit, the rest for the process's own files
    socks: list[socket.socket] = []
    answers = []
    try:
        for _ in range(6):  # 300 heads that never end, more than the process has descriptors
            for _ in range(50):
                s = socket.create_connection(("127.0.0.1", port))
                s.send(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
                socks.append(s)
            t0 = time.monotonic()
            status, body = ask(port, "/health", timeout_s=5)
            answers.append((status, time.monotonic() - t0))
            assert b'"ok": true' in body
        assert all(status == 200 and took < 2.0 for status, took in answers), answers
        assert open_fds(proc.pid) - base <= cap + 2, open_fds(proc.pid) - base
        deadline = time.monotonic() + ConnectionLimits().header_timeout_s + 5
        while open_fds(proc.pid) > base + 1 and time.monotonic() < deadline:
            time.sleep(0.5)
        assert open_fds(proc.pid) <= base + 1  # every held head closed after header_timeout_s
        assert proc.poll() is None
    finally:
        for s in socks:
            s.close()
