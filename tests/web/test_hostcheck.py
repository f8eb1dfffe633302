"""The Host/Origin rules every dart HTTP server applies (issue 54), as a table: what a browser
page using DNS rebinding or posting across sites sends is refused; what curl, scripts, Prometheus
and the server's own page send is answered. Each server applies them on a real socket in its own
tests (tests/data/test_http_hosts.py, tests/rollout/test_serve_connections.py,
tests/metrics/test_metrics_server.py, tests/env/test_agent_without_token.py)."""

from __future__ import annotations

import pytest

from dart.web.hostcheck import HostCheck, host_name

ANSWERED = [
    (None, None),                                              # HTTP/1.0, no browser
    ("127.0.0.1:8123", None),                                  # curl, clickhouse-connect
    ("127.0.0.1", None),
    ("10.0.3.7:9400", None),                                   # Prometheus scraping a container's address
    ("[::1]:8000", None),
    ("localhost:8000", "http://localhost:8000"),               # the server's own page
    ("LocalHost.:8000", None),
    ("app.localhost:8000", None),                              # *.localhost never leaves the host
    ("127.0.0.1:8123", "http://127.0.0.1:8123"),
    ("dart.example.org:443", "https://dart.example.org:443"),  # listed in $DART_HTTP_ALLOWED_HOSTS
]
REFUSED = [
    ("evil.example:8123", None),                               # DNS rebinding: the page's own name
    ("evil.example:8123", "http://evil.example:8123"),
    ("x", None),
    ("127.0.0.1.evil.example", None),
    ("localhost.evil.example:80", None),
    ("2130706433:8123", None),                                 # not an address ipaddress reads: a name
    ("127.0.0.1:8123", "http://evil.example"),                 # a page elsewhere posting here
    ("127.0.0.1:8123", "null"),                                # a sandboxed frame or a file: page
    ("127.0.0.1:8123", "http://127.0.0.1:9999"),               # another local server's page
    (None, "http://127.0.0.1:8123"),
    ("", None),
    ("127.0.0.1:port", None),
    ("[::1", None),
]


@pytest.mark.parametrize(("host", "origin"), ANSWERED)
def test_what_clients_and_the_servers_own_page_send_is_answered(host, origin) -> None:
    check = HostCheck.from_env({"DART_HTTP_ALLOWED_HOSTS": " dart.example.org ,, other.example."})
    assert check.refusal(host, origin) is None


@pytest.mark.parametrize(("host", "origin"), REFUSED)
def test_what_a_web_page_sends_is_refused_with_the_fix(host, origin) -> None:
    why = HostCheck.from_env({}).refusal(host, origin)
    assert why is not None and "\n" not in why
    assert ("DART_HTTP_ALLOWED_HOSTS" in why) if "Host" in why.split()[0] else ("Origin" in why)


def test_host_names_are_read_without_the_port_and_in_lower_case() -> None:
    assert [host_name(v) for v in ("A.Example:80", "[::1]:8", "[::1]", "name", "x.:1", ":80", "a:b:c")] == \
        ["a.example", "::1", "::1", "name", "x", None, None]
    assert HostCheck.from_env({"DART_HTTP_ALLOWED_HOSTS": "Other.Example."}).names == frozenset({"other.example"})
