"""The dev broker's TLS front (dart/bus/broker_tls.py) is bounded like dart's HTTP servers
(issue 54), on real sockets with a throwaway CA: connections that never finish a handshake hold
at most ``max_connections`` and are closed by the handshake deadline, a client with the CA's
certificate still gets in at once, and established connections are never closed for newcomers
(past the cap, a newcomer is)."""

from __future__ import annotations

import contextlib
import socket
import socketserver
import ssl
import threading
import time
from collections.abc import Iterator

import pytest

from dart.bus.broker import free_port
from dart.bus.broker_tls import BrokerTls, TlsFront, throwaway_tls
from dart.web.httplimits import ConnectionLimits

pytestmark = pytest.mark.skipif(__import__("shutil").which("openssl") is None, reason="needs openssl")
LIMITS = ConnectionLimits(max_connections=8, header_timeout_s=1.0)


class Echo(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        with contextlib.suppress(OSError):
            while data := self.request.recv(1 << 16):
                self.request.sendall(data)


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> BrokerTls:
    return throwaway_tls(tmp_path_factory.mktemp("tls"))


@pytest.fixture
def front(tls: BrokerTls) -> Iterator[tuple[TlsFront, BrokerTls]]:
    """A TLS front on a free loopback port, forwarding to an echo server."""
    upstream = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Echo)
    upstream.daemon_threads = True
    threading.Thread(target=upstream.serve_forever, daemon=True).start()
    f = TlsFront(free_port(), upstream.server_address[1], tls, LIMITS).start()
    try:
        yield f, tls
    finally:
        f.stop()
        upstream.shutdown()
        upstream.server_close()


def tls_client(front: TlsFront, tls: BrokerTls) -> ssl.SSLSocket:
    context = ssl.create_default_context(cafile=str(tls.ca_file))
    context.load_cert_chain(str(tls.client_cert_file), str(tls.client_key_file))
    return context.wrap_socket(socket.create_connection(("127.0.0.1", front.port), timeout=5),
                               server_hostname="127.0.0.1")


def echoes(client: ssl.SSLSocket) -> bool:
    client.sendall(b"ping")
    return client.recv(4) == b"ping"


def test_connections_that_never_handshake_are_bounded_and_closed(front) -> None:
    f, tls = front
    raw = []
    try:
        most = 0
        for i in range(40):  # never a handshake; half of them begin one (a TLS record header) and stop
            s = socket.create_connection(("127.0.0.1", f.port))
            if i % 2:
                s.send(b"\x16\x03\x01")
            raw.append(s)
            most = max(most, f.open)
        time.sleep(0.3)
        # (the listen backlog is the cap too: past it the kernel makes a client retry, so some are
        # accepted after others have timed out)
        assert max(most, f.open) <= LIMITS.max_connections
        assert f.evicted + f.timed_out >= 40 - LIMITS.max_connections
        t0 = time.monotonic()
        with tls_client(f, tls) as client:
            assert echoes(client) and time.monotonic() - t0 < 1.0  # a real client gets in at once
            deadline = time.monotonic() + LIMITS.header_timeout_s + 3
            while f.open > 1 and time.monotonic() < deadline:
                time.sleep(0.1)
            assert f.open == 1 and f.timed_out >= 1  # only the client is left: the rest timed out
            assert echoes(client)  # an established connection outlives the handshake deadline
    finally:
        for s in raw:
            s.close()


def test_past_the_cap_a_newcomer_is_refused_and_established_clients_keep_working(front) -> None:
    f, tls = front
    clients = [tls_client(f, tls) for _ in range(LIMITS.max_connections)]
    try:
        assert all(echoes(c) for c in clients)
        with pytest.raises((ssl.SSLError, OSError)):
            tls_client(f, tls)  # every place is taken by an established client
        assert f.refused >= 1
        assert all(echoes(c) for c in clients)
    finally:
        for c in clients:
            c.close()
