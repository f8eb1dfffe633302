"""``dart guest-agent``: the in-VM HTTP server (OSWorld-compatible endpoints, typed actions).

A thin aiohttp shell over :mod:`.protocol` (what a request means) and :mod:`.desktop` (what
it does to the display). Every malformed request is a 400 with the reason; a failure of
the display is a 500 with the reason; the server itself never goes down over a request.

**The token is the boundary.** Whoever holds the VM's token runs any program as the agent's
user (``/execute`` takes an argv, and ``["bash", "-c", "..."]`` is an argv: OSWorld's task
setup runs ``python -c`` and ``bash -c`` that way and must keep working). ``allow_shell``
only decides whether the ``shell: true`` string form is accepted; it is not a security
boundary. So the token is kept where only the agent reads it: a token file must be the
agent user's own and readable by nobody else (mode 0600 or 0400), and no child the agent
starts inherits it or any other ``DART_*`` secret (:func:`child_environment`).

**No web page reaches it.** Every request passes the checks every dart HTTP server makes
(:mod:`dart.web.httplimits`: bounded connections, a ``Host`` that is an address or localhost,
no foreign ``Origin``: a page using DNS rebinding or posting across sites gets a 403), and a body
the agent reads as JSON must say ``Content-Type: application/json`` (a browser cannot send that
cross-site without asking first), else a 415 before anything runs. **Without a token** (a person
or a test trying the agent on loopback) it binds an IPv4 loopback address only, answers only
processes of its own user (the owner of the peer socket, from ``/proc/net/tcp``), says so at
start, and refuses to start as root unless ``root_without_token`` is set.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import os
import platform
import socket
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web

from dart.agent.actions import InvalidAction
from dart.env.guest_agent import protocol
from dart.env.guest_agent.desktop import Desktop
from dart.env.xdotool import UnknownKey
from dart.errors import ConfigError, DartError
from dart.web.hostcheck import HostCheck
from dart.web.httplimits import ConnectionLimits, LimitedSite

log = logging.getLogger(__name__)

MAX_UPLOAD_BYTES = 2 * 1024**3


@dataclass(frozen=True, kw_only=True, slots=True)
class AgentConfig:
    display: str = ":0"
    """X display the agent serves (screenshots and input go there)."""
    host: str = protocol.DEFAULT_HOST
    """Address to bind; loopback by default. Inside a VM, bind the guest NIC (or 0.0.0.0)."""
    port: int = protocol.DEFAULT_PORT
    """TCP port (OSWorld's server uses 5000)."""
    allow_shell: bool = False
    """Accept ``shell: true`` strings (run under ``sh -c``). Off: argv lists only. A convenience
    switch, not a boundary: a token holder may send ``["sh", "-c", "..."]`` as an argv anyway."""
    run_as: str | None = None
    """The desktop user every program the agent starts runs as (the agent itself runs as another
    user, root or one with CAP_SETUID, who alone may read its token file). None: as the agent."""
    token: str | None = field(default=None, repr=False)
    """Every request but ``/health`` must carry it in ``X-Dart-Agent-Token``. None (an IPv4
    loopback address only, for a person or a test trying the agent by hand) answers the agent
    user's own processes without one."""
    root_without_token: bool = False
    """Let an agent without a token start as root (every root process may then run commands
    through it). Off: it refuses to."""

    def __post_init__(self) -> None:
        if self.token is None and not _is_ipv4_loopback(self.host):
            raise ConfigError(f"guest agent: binding {self.host} needs a token (--token-file or $DART_AGENT_TOKEN); "
                              "without one, only an IPv4 loopback address (127.0.0.1) may be bound")

    def startup_refusal(self, euid: int) -> str | None:
        """Why an agent of this config may not start as user ``euid``, None if it may."""
        if self.token is None and euid == 0 and not self.root_without_token:
            return ("guest agent: refusing to run as root without a token (every process of root could run "
                    "commands through it): run it as your own user, give it a token (--token-file), or pass "
                    "--root-without-token")
        return None


DESKTOP_KEY = web.AppKey("desktop", Desktop)
CONFIG_KEY = web.AppKey("config", AgentConfig)
STARTED_KEY = web.AppKey("started", float)


_SECRET_WORDS = ("TOKEN", "PASSWORD", "SECRET", "KEY", "CREDENTIAL")


def is_secret_name(name: str) -> bool:
    """``DART_AGENT_TOKEN``, and any ``DART_*`` variable named like a secret (``DART_KAFKA_PASSWORD``...)."""
    upper = name.upper()
    return upper == "DART_AGENT_TOKEN" or (upper.startswith("DART_") and any(w in upper for w in _SECRET_WORDS)
                                           and not upper.endswith("_FILE"))


def child_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """``environ`` without the agent's token or any ``DART_*`` secret: what children get."""
    return {k: v for k, v in environ.items() if not is_secret_name(k)}


def scrub_environment() -> list[str]:
    """Drop the token and ``DART_*`` secrets from this process's environment (``os.environ``, so
    no child started later inherits them); returns the names dropped. Call once the token is
    read. (``/proc/self/environ`` keeps the start-up environment, readable by the agent's own
    user only: prefer ``--token-file`` to ``$DART_AGENT_TOKEN``.)"""
    dropped = [k for k in os.environ if is_secret_name(k)]
    for k in dropped:
        del os.environ[k]
    return dropped


def create_app(cfg: AgentConfig, desktop: Desktop | None = None) -> web.Application:
    """The aiohttp application; ``desktop`` defaults to one on ``cfg.display``. Children of the
    desktop never see the token or a ``DART_*`` secret, whatever the environment holds."""
    app = web.Application(client_max_size=MAX_UPLOAD_BYTES, middlewares=[_auth, _errors])
    app[CONFIG_KEY] = cfg
    desktop = desktop or Desktop(cfg.display, run_as=cfg.run_as)
    if isinstance(getattr(desktop, "env", None), dict):
        desktop.env = child_environment(desktop.env)
    app[DESKTOP_KEY] = desktop
    app[STARTED_KEY] = time.monotonic()
    app.router.add_get("/health", health)
    app.router.add_get("/platform", platform_name)
    app.router.add_get("/screenshot", screenshot)
    app.router.add_route("*", "/screen_size", screen_size)
    app.router.add_get("/cursor_position", cursor_position)
    app.router.add_post("/execute", execute)
    app.router.add_post("/setup/execute", execute)
    app.router.add_post("/setup/launch", launch)
    app.router.add_post("/file", get_file)
    app.router.add_post("/setup/upload", upload)
    app.router.add_post("/setup/open_file", open_file)
    app.router.add_post("/setup/activate_window", activate_window)
    app.router.add_post("/action", action)
    app.on_cleanup.append(_close_desktop)
    return app


def check_token_file(path: Path) -> None:
    """ConfigError unless ``path`` belongs to this process's user and nobody else may read it."""
    st = path.stat()
    if st.st_uid != os.geteuid():
        raise ConfigError(f"guest agent: the token file {path} belongs to uid {st.st_uid}, not to the agent's user "
                          f"(uid {os.geteuid()}): chown it")
    if st.st_mode & 0o077:
        raise ConfigError(f"guest agent: the token file {path} has mode {st.st_mode & 0o777:o}; others may read it: "
                          "chmod 600 it")


def read_token(token_file: str | None, environ: Mapping[str, str]) -> str | None:
    """The agent's token: ``token_file`` if given, else $DART_AGENT_TOKEN, else ``TOKEN_FILE``
    when the VM has one; None when none of them exists (then only loopback may be bound). A
    token file must be the agent user's own, mode 0600 or stricter (``check_token_file``)."""
    if token_file is None and environ.get("DART_AGENT_TOKEN"):
        return protocol.parse_token(environ["DART_AGENT_TOKEN"])
    path = Path(token_file or protocol.TOKEN_FILE)
    if token_file is None and not path.exists():
        return None
    try:
        check_token_file(path)
        return protocol.parse_token(path.read_text())
    except OSError as exc:
        raise ConfigError(f"guest agent: cannot read the token file {path}: {exc}") from exc


def nic_address() -> str:
    """The local address of the interface on the default route (inside a VM: the address the
    env worker reaches it at). Connecting a UDP socket sends nothing; it only picks the route."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))  # TEST-NET-1: never routed anywhere, only looked up
        except OSError as exc:
            raise ConfigError(f"guest agent: no default route to take the NIC address from ({exc}); "
                              "pass --host ADDRESS") from exc
        return str(s.getsockname()[0])


def _is_ipv4_loopback(host: str) -> bool:
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    return address.version == 4 and address.is_loopback


@web.middleware
async def _auth(request: web.Request, handler: Any) -> web.StreamResponse:
    # Checked before the handler reads the body, so an unauthorised request runs nothing,
    # writes nothing and is not even parsed.
    token = request.app[CONFIG_KEY].token
    if token is not None and request.path not in protocol.OPEN_PATHS:
        try:
            protocol.check_token(token, request.headers.get(protocol.TOKEN_HEADER))
        except protocol.Unauthorized as exc:
            log.warning("refused %s %s from %s: %s", request.method, request.path, request.remote, exc)
            return web.json_response({"status": "error", "error": str(exc)}, status=401)
    return await handler(request)


class WrongContentType(protocol.ProtocolError):
    """A body of another content type than the endpoint reads (HTTP 415)."""


@web.middleware
async def _errors(request: web.Request, handler: Any) -> web.StreamResponse:
    try:
        return await handler(request)
    except web.HTTPException:
        raise
    except WrongContentType as exc:
        return web.json_response({"status": "error", "error": str(exc)}, status=415)
    except protocol.ProtocolError as exc:
        return web.json_response({"status": "error", "error": str(exc)}, status=400)
    except (DartError, OSError) as exc:
        log.warning("%s %s failed: %s", request.method, request.path, exc)
        return web.json_response({"status": "error", "error": f"{type(exc).__name__}: {exc}"}, status=500)


def _require_type(request: web.Request, *types: str) -> None:
    """WrongContentType unless the body says it is one of ``types``; checked before it is read."""
    if request.content_type not in types:
        raise WrongContentType(f"{request.method} {request.path} takes Content-Type {' or '.join(types)}, "
                               f"not {request.content_type!r}")


async def _json(request: web.Request) -> Any:
    # A browser sends application/json across sites only after asking (CORS preflight), which
    # this server never grants: text/plain and forms, which it sends unasked, are refused.
    _require_type(request, "application/json")
    try:
        return await request.json()
    except ValueError as exc:
        raise protocol.ProtocolError(f"body is not JSON: {exc}") from exc


async def health(request: web.Request) -> web.Response:
    desktop = request.app[DESKTOP_KEY]
    width, height = await desktop.screen_size()
    return web.json_response(
        {
            "ok": True,
            "display": desktop.display,
            "width": width,
            "height": height,
            "uptime_s": round(time.monotonic() - request.app[STARTED_KEY], 3),
            "pid": os.getpid(),
        }
    )


async def platform_name(request: web.Request) -> web.Response:
    return web.Response(text=platform.system())


async def screenshot(request: web.Request) -> web.Response:
    png = await request.app[DESKTOP_KEY].screenshot_png()
    return web.Response(body=png, content_type="image/png")


async def screen_size(request: web.Request) -> web.Response:
    width, height = await request.app[DESKTOP_KEY].screen_size()
    return web.json_response({"width": width, "height": height})


async def cursor_position(request: web.Request) -> web.Response:
    x, y = await request.app[DESKTOP_KEY].cursor_position()
    return web.json_response([x, y])


async def execute(request: web.Request) -> web.Response:
    req = protocol.parse_exec(await _json(request), allow_shell=request.app[CONFIG_KEY].allow_shell)
    res = await request.app[DESKTOP_KEY].run(list(req.argv), timeout_s=req.timeout_s)
    return web.json_response(protocol.exec_response(res.returncode, res.stdout, res.stderr))


async def launch(request: web.Request) -> web.Response:
    req = protocol.parse_exec(await _json(request), allow_shell=request.app[CONFIG_KEY].allow_shell)
    pid = await request.app[DESKTOP_KEY].launch(list(req.argv))
    return web.json_response({"status": "success", "pid": pid})


async def get_file(request: web.Request) -> web.StreamResponse:
    # OSWorld's clients send a form here (and dart's, for a stock server): the Origin/Host check
    # is what keeps browsers out of this one.
    _require_type(request, "application/json", "application/x-www-form-urlencoded", "multipart/form-data")
    if request.content_type == "application/json":
        body = await _json(request)
        path = protocol.parse_path(body.get("file_path") if isinstance(body, dict) else None)
    else:
        path = protocol.parse_path((await request.post()).get("file_path"))
    target = Path(path).expanduser()
    if not target.is_file():
        return web.json_response({"status": "error", "error": f"file not found: {path}"}, status=404)
    return web.Response(body=await asyncio.to_thread(target.read_bytes), content_type="application/octet-stream")


async def upload(request: web.Request) -> web.Response:
    _require_type(request, "multipart/form-data")
    form = await request.post()
    path = protocol.parse_path(form.get("file_path"))
    data = form.get("file_data")
    if not isinstance(data, web.FileField):
        raise protocol.ProtocolError("'file_data' must be a multipart file part")
    target = Path(path).expanduser()

    def write() -> int:
        target.parent.mkdir(parents=True, exist_ok=True)
        payload = data.file.read()
        target.write_bytes(payload)
        return len(payload)

    size = await asyncio.to_thread(write)
    return web.json_response({"status": "success", "path": str(target), "size_bytes": size})


async def open_file(request: web.Request) -> web.Response:
    body = await _json(request)
    path = protocol.parse_path(body.get("path") if isinstance(body, dict) else None, "path")
    target = Path(path).expanduser()
    if not target.exists():
        return web.json_response({"status": "error", "error": f"file not found: {path}"}, status=404)
    pid = await request.app[DESKTOP_KEY].launch(["xdg-open", str(target)])
    return web.json_response({"status": "success", "pid": pid})


async def activate_window(request: web.Request) -> web.Response:
    req = protocol.parse_window(await _json(request))
    desktop = request.app[DESKTOP_KEY]
    found = await desktop.run(protocol.window_search_argv(req), timeout_s=10)
    ids = found.stdout.split()
    if not ids:
        return web.json_response({"status": "error", "error": f"no window matches {req.window_name!r}"}, status=404)
    res = await desktop.run(["xdotool", "windowactivate", "--sync", ids[0]], timeout_s=10)
    if res.returncode != 0:
        return web.json_response({"status": "error", "error": res.stderr.strip()}, status=500)
    return web.json_response({"status": "success", "window": ids[0]})


async def action(request: web.Request) -> web.Response:
    typed = protocol.parse_action(await _json(request))
    if isinstance(typed, InvalidAction):
        return web.json_response({"status": "error", "error": typed.reason}, status=400)
    t0 = time.perf_counter()
    try:
        commands = await request.app[DESKTOP_KEY].act(typed)
    except UnknownKey as exc:
        # A key the model made up: the step does nothing, which is the agent's problem, not the VM's.
        return web.json_response({"status": "noop", "kind": typed.kind, "error": str(exc)})
    return web.json_response({"status": "success" if commands else "noop", "kind": typed.kind,
                              "commands": commands, "duration_s": round(time.perf_counter() - t0, 4)})


async def _close_desktop(app: web.Application) -> None:
    await app[DESKTOP_KEY].close()


def no_token_warning(host: str, port: int, euid: int) -> str:
    return (f"guest agent: NO TOKEN. Every process of uid {euid} on this host can run commands as uid {euid} "
            f"through http://{host}:{port} (other users and web pages are refused). Fine for a test on your "
            "own machine; an agent in a VM takes --token-file")


async def serve(cfg: AgentConfig, *, ready: asyncio.Event | None = None) -> None:
    """Serve until cancelled. The token and ``DART_*`` secrets leave this process's environment first.
    ConfigError when ``cfg`` may not start as this user (``AgentConfig.startup_refusal``)."""
    euid = os.geteuid()
    refusal = cfg.startup_refusal(euid)
    if refusal is not None:
        raise ConfigError(refusal)
    dropped = scrub_environment()
    if dropped:
        log.info("guest agent: dropped %s from the environment (children never inherit them)", ", ".join(dropped))
    # Without a token, the peer socket's owner is the boundary: only this user's processes.
    site = LimitedSite(ConnectionLimits(), hosts=HostCheck.from_env(), only_uid=None if cfg.token else euid)
    try:
        port = await site.serve(create_app(cfg), cfg.host, cfg.port)
        log.info("guest agent on http://%s:%d serving display %s (%s)", cfg.host, port, cfg.display,
                 "token required" if cfg.token else f"no token: uid {euid} on loopback only")
        if cfg.token is None:
            log.warning("%s", no_token_warning(cfg.host, port, euid))
        if ready is not None:
            ready.set()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.Event().wait()
    finally:
        await site.stop()
