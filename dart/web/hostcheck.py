"""Which ``Host`` and ``Origin`` headers a dart HTTP server answers: the guard against web pages.

A page the user opens in a browser may send requests to ``127.0.0.1`` (a GET, or a "simple"
POST of ``text/plain`` or a form, goes out without asking the server first), and by pointing
its own name at ``127.0.0.1`` (DNS rebinding) it can read the answers too. Two headers give it
away, and no page can set either:

- ``Host`` is the name the browser connected to; a rebinding page's is its own name
  (``evil.example:8123``). Answered: no ``Host`` (not a browser), an IP address (a page whose
  origin is an address is this server's own: there is no name to rebind), ``localhost`` and names
  under ``.localhost`` (browsers resolve them to loopback without DNS), and the names listed in
  ``$DART_HTTP_ALLOWED_HOSTS`` (comma-separated: a name you put in front of the server). The port
  is not compared: a forwarded port (Docker, ``ssh -L``) changes it, and a browser sends the one
  it connected to.
- ``Origin`` is the page that made the request; a browser sends it with every cross-origin
  request and every POST. Answered: none, or the server's own (``http://`` or ``https://`` and
  the ``Host``). ``Origin: null`` (a sandboxed frame, a ``file:`` page) is refused.

Anything else gets a 403 before a handler runs (``LimitedSite`` applies it to every request).
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Mapping
from dataclasses import dataclass

ENV = "DART_HTTP_ALLOWED_HOSTS"


def host_name(value: str) -> str | None:
    """The name part of a ``Host`` value (``name``, ``name:port``, ``[v6]:port``), lower case and
    without a trailing dot; None when it is not one."""
    value = value.strip().lower()
    if value.startswith("["):
        name, sep, rest = value[1:].partition("]")
        if not sep or (rest and not (rest.startswith(":") and rest[1:].isdigit())):
            return None
    else:
        name, sep, port = value.rpartition(":")
        if not sep:
            name = port
        elif not port.isdigit() or ":" in name:
            return None
    name = name.rstrip(".")
    return name or None


def is_address(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


@dataclass(frozen=True, slots=True)
class HostCheck:
    """The ``Host`` names a server answers besides addresses and ``localhost``; see the module."""

    names: frozenset[str] = frozenset()
    """Lower case, no port (``dart.example.org``)."""

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> HostCheck:
        """The names in ``$DART_HTTP_ALLOWED_HOSTS`` (comma-separated)."""
        raw = (os.environ if environ is None else environ).get(ENV, "")
        return cls(frozenset(n.strip().lower().rstrip(".") for n in raw.split(",") if n.strip()))

    def allows_name(self, name: str) -> bool:
        return is_address(name) or name == "localhost" or name.endswith(".localhost") or name in self.names

    def refusal(self, host: str | None, origin: str | None) -> str | None:
        """Why a request with these headers is refused (one line naming the fix), None if answered."""
        if host is not None:
            name = host_name(host)
            if name is None or not self.allows_name(name):
                return (f"Host {host[:100]!r} is not a name this server answers (an address, localhost, or one "
                        f"listed in ${ENV}): a web page that points its own name here (DNS rebinding) is refused")
        if origin is None:
            return None
        if host is not None and origin.strip().lower() in (f"http://{host.lower()}", f"https://{host.lower()}"):
            return None
        return (f"Origin {origin[:100]!r} is not this server ({host!r}): requests from other web pages are refused; "
                "send no Origin header (curl, a script) or call it from its own address")
