"""Every /metrics port is bounded (issue 44): idle and one-byte-at-a-time connections hold at most
``max_connections`` threads, each closed by its deadline, and a scrape still answers."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
import urllib.request

from dart.bus.prom import BoundedMetricsServer, serve_metrics


def test_idle_and_slow_connections_are_bounded_and_closed_and_a_scrape_answers(monkeypatch) -> None:
    monkeypatch.setattr(BoundedMetricsServer, "max_connections", 8)
    monkeypatch.setattr(BoundedMetricsServer, "timeout_s", 1.0)
    monkeypatch.setattr(BoundedMetricsServer, "deadline_s", 2.0)
    server = serve_metrics("127.0.0.1", 0)
    port = int(server.server_port)
    threads_before = threading.active_count()
    socks = []
    try:
        for i in range(60):  # idle connections, and heads sent slowly
            s = socket.create_connection(("127.0.0.1", port))
            if i % 2:
                s.send(b"GET /metrics HTTP/1.1\r\n")
            socks.append(s)
        time.sleep(0.3)
        assert server.open_connections <= 8
        assert threading.active_count() - threads_before <= 8
        assert server.refused >= 60 - 8
        for s in socks:  # a slowloris: a byte now and then, never a whole head (the refused ones are closed)
            with contextlib.suppress(OSError):
                s.send(b"X")
        deadline = time.monotonic() + 6
        while server.open_connections and time.monotonic() < deadline:
            time.sleep(0.1)
        assert server.open_connections == 0  # every one closed by its timeout or deadline
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
        assert "python_info" in text or "dart_" in text or "process_" in text
    finally:
        for s in socks:
            s.close()
        server.shutdown()
