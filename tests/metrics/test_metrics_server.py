"""Every /metrics port is bounded (issues 44 and 54) by the limits every dart HTTP server has
(dart.web.httplimits), on a real socket: idle and one-byte-at-a-time connections hold at most
``max_connections``, a scrape still gets in at once, each held one is closed by its deadline, and
a web page (DNS rebinding, a cross-site request) gets a 403."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
import urllib.request

from dart.bus.prom import serve_metrics
from dart.web.httplimits import ConnectionLimits
from tests.web.rebinding import assert_refuses_web_pages


def test_idle_and_slow_connections_are_bounded_and_closed_and_a_scrape_answers() -> None:
    server = serve_metrics("127.0.0.1", 0, ConnectionLimits(max_connections=8, header_timeout_s=1.0,
                                                            idle_timeout_s=2.0))
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
        assert threading.active_count() == threads_before  # no thread per connection
        # (past the listen backlog the kernel makes a client retry: on a busy machine some are
        # accepted after others have expired)
        assert server.site.evicted + server.site.expired >= 60 - 8
        t0 = time.monotonic()
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
        assert time.monotonic() - t0 < 1.0 and ("python_info" in text or "process_" in text)
        for s in socks:  # a slowloris: a byte now and then, never a whole head (the evicted ones are closed)
            with contextlib.suppress(OSError):
                s.send(b"X")
        deadline = time.monotonic() + 6
        while server.open_connections and time.monotonic() < deadline:
            time.sleep(0.1)
        assert server.open_connections == 0  # every one closed by its deadline
        assert server.site.expired >= 1
    finally:
        for s in socks:
            s.close()
        server.shutdown()


def test_metrics_refuse_dns_rebinding_and_cross_site_requests() -> None:
    server = serve_metrics("127.0.0.1", 0)
    try:
        assert_refuses_web_pages(int(server.server_port), "/metrics")
    finally:
        server.shutdown()
