"""What a web page sends to a dart server on loopback, over a real socket (http.client lets a test
set ``Host`` and ``Origin`` as a browser would): each server's tests call ``assert_refuses_web_pages``."""

from __future__ import annotations

import http.client


def ask(port: int, path: str, *, method: str = "GET", headers: dict[str, str] | None = None,
        body: bytes | None = None, timeout_s: float = 10.0) -> tuple[int, bytes]:
    """(status, body) of one request to ``127.0.0.1:port`` with exactly ``headers`` (Host included
    when given; else http.client's own, ``127.0.0.1:port``)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout_s)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def web_page_headers(port: int) -> list[dict[str, str]]:
    """Headers of requests a page on another site can make a browser send to ``127.0.0.1:port``."""
    evil = f"evil.example:{port}"
    return [{"Host": evil},                                              # DNS rebinding: a GET
            {"Host": evil, "Origin": f"http://{evil}"},                  # DNS rebinding: a POST
            {"Origin": "http://evil.example"},                           # a cross-site POST
            {"Origin": "null"}]                                          # from a sandboxed frame


def assert_refuses_web_pages(port: int, path: str, *, method: str = "GET", headers: dict[str, str] | None = None,
                             body: bytes | None = None, ok: int = 200) -> None:
    """The request answers ``ok`` from a script and from the server's own page, and 403 with the
    reason from every web page of ``web_page_headers``."""
    headers = headers or {}
    assert ask(port, path, method=method, headers=headers, body=body)[0] == ok
    own = {"Host": f"localhost:{port}", "Origin": f"http://localhost:{port}"}
    assert ask(port, path, method=method, headers={**headers, **own}, body=body)[0] == ok
    for page in web_page_headers(port):
        status, text = ask(port, path, method=method, headers={**headers, **page}, body=body)
        assert status == 403 and b"refused" in text, (page, status, text[:300])
