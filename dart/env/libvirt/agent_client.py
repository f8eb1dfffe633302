"""Async client of the in-guest agent: ``dart guest-agent`` or OSWorld's own server.

Only endpoints both servers answer are used for setup steps and getters (``/execute``,
``/file``, ``/setup/upload``, ``/screenshot``, ``/screen_size``, ``/setup/launch``, ...).
Typed actions go to ``/action``; a stock OSWorld server has no such endpoint (it runs
pyautogui code, which we never send), so there the same xdotool argv lists the xdesktop
backend would run are sent through ``/execute`` — input events either way, never code.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import aiohttp

from dart.agent.actions import Action, to_wire
from dart.env import xdotool
from dart.env.backend import CommandResult
from dart.env.guest_agent.protocol import TOKEN_HEADER, action_body
from dart.errors import EnvError

log = logging.getLogger(__name__)


class AgentClient:
    """One guest's agent at ``base_url`` (``http://10.0.0.5:5000``). ``token`` goes with every
    request (``X-Dart-Agent-Token``); a stock OSWorld server ignores the header."""

    def __init__(self, base_url: str, *, token: str | None = None, timeout_s: float = 60.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout_s = timeout_s
        self.token = token
        self._headers = {TOKEN_HEADER: token} if token else {}
        self._has_action_endpoint: bool | None = None
        self._session: aiohttp.ClientSession | None = None

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            # No keep-alive: after a snapshot revert the guest's TCP state is from the past, and a
            # pooled connection would be a dead one.
            self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True))
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def _request(self, method: str, path: str, *, timeout_s: float | None = None, **kw: Any) -> tuple[int, bytes]:
        url = f"{self.base_url}{path}"
        timeout = aiohttp.ClientTimeout(total=timeout_s or self.timeout_s)
        try:
            async with self._http().request(method, url, timeout=timeout, headers=self._headers, **kw) as resp:
                return resp.status, await resp.read()
        except TimeoutError as exc:
            raise EnvError(f"guest agent {url} did not answer in {timeout.total:g} s") from exc
        except aiohttp.ClientError as exc:
            raise EnvError(f"guest agent {url} unreachable: {exc}") from exc

    async def _ok(self, method: str, path: str, **kw: Any) -> bytes:
        status, body = await self._request(method, path, **kw)
        if status != 200:
            raise EnvError(f"guest agent {self.base_url}{path} answered {status}: {_reason(body)}")
        return body

    async def probe(self, *, timeout_s: float) -> bool:
        """One readiness check: the agent answers and knows its screen size."""
        try:
            w, h = await self.screen_size(timeout_s=timeout_s)
        except EnvError:
            return False
        return w > 0 and h > 0

    async def screen_size(self, *, timeout_s: float | None = None) -> tuple[int, int]:
        body = _json(await self._ok("POST", "/screen_size", timeout_s=timeout_s), "/screen_size")
        try:
            return int(body["width"]), int(body["height"])
        except (KeyError, TypeError, ValueError) as exc:
            raise EnvError(f"guest agent /screen_size answered {body!r}") from exc

    async def screenshot(self) -> bytes:
        png = await self._ok("GET", "/screenshot")
        if not png.startswith(b"\x89PNG"):
            raise EnvError(f"guest agent /screenshot did not return a PNG ({len(png)} bytes)")
        return png

    async def platform(self) -> str:
        return (await self._ok("GET", "/platform")).decode(errors="replace").strip()

    async def execute(self, argv: list[str], *, timeout_s: float = 30.0) -> CommandResult:
        """Run an argv list in the guest (no shell). A non-zero exit is a result, not an error."""
        payload = {"command": list(argv), "shell": False, "timeout": timeout_s}
        status, raw = await self._request("POST", "/execute", json=payload, timeout_s=timeout_s + 10)
        body = _json(raw, "/execute") if raw else {}
        if status != 200 and not (isinstance(body, dict) and "returncode" in body):
            raise EnvError(f"guest agent /execute {argv[:1]} answered {status}: {_reason(raw)}")
        return CommandResult(
            returncode=int(body.get("returncode", -1)),
            stdout=str(body.get("output") or ""),
            stderr=str(body.get("error") or ""),
        )

    async def launch(self, argv: list[str]) -> None:
        await self._ok("POST", "/setup/launch", json={"command": list(argv), "shell": False})

    async def read_file(self, path: str) -> bytes:
        status, body = await self._request("POST", "/file", data={"file_path": path})
        if status == 404:
            raise FileNotFoundError(path)
        if status != 200:
            raise EnvError(f"guest agent /file {path} answered {status}: {_reason(body)}")
        return body

    async def upload(self, path: str, data: bytes) -> None:
        form = aiohttp.FormData()
        form.add_field("file_path", path)
        form.add_field("file_data", data, filename=path.rsplit("/", 1)[-1] or "file",
                       content_type="application/octet-stream")
        await self._ok("POST", "/setup/upload", data=form)

    async def open_file(self, path: str) -> None:
        await self._ok("POST", "/setup/open_file", json={"path": path})

    async def activate_window(self, window_name: str, *, strict: bool = False, by_class: bool = False) -> None:
        await self._ok("POST", "/setup/activate_window",
                       json={"window_name": window_name, "strict": strict, "by_class": by_class})

    async def act(self, action: Action) -> None:
        """Send one typed action as input events."""
        if self._has_action_endpoint is not False:
            status, body = await self._request("POST", "/action", json=action_body(to_wire(action)))
            if status == 200:
                self._has_action_endpoint = True
                return
            if status not in (404, 405) or self._has_action_endpoint:
                raise EnvError(f"guest agent /action {action.kind} answered {status}: {_reason(body)}")
            log.info("guest agent %s has no /action (a stock OSWorld server): sending xdotool argv", self.base_url)
            self._has_action_endpoint = False
        try:
            argvs = xdotool.xdotool_argvs(action, screen=await self.screen_size())
        except xdotool.UnknownKey:
            return
        for argv in argvs:
            res = await self.execute(list(argv))
            if res.returncode != 0:
                raise EnvError(f"{argv[0]} failed in the guest ({res.returncode}): {res.stderr.strip()}")


def _json(raw: bytes, where: str) -> Any:
    try:
        return json.loads(raw)
    except ValueError as exc:
        raise EnvError(f"guest agent {where} answered non-JSON: {raw[:200]!r}") from exc


def _reason(raw: bytes) -> str:
    try:
        body = json.loads(raw)
    except ValueError:
        return raw[:300].decode(errors="replace")
    if isinstance(body, dict):
        return str(body.get("error") or body.get("message") or body)[:300]
    return str(body)[:300]
