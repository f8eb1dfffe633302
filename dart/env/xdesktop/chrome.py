"""Chromium on a slot's display, driven through the DevTools protocol.

OSWorld tasks start ``google-chrome --remote-debugging-port=1337`` (plus a ``socat`` forwarder
from 9222) and then open, close and inspect tabs over that port. Here the command becomes
Debian's ``chromium`` with the slot's own profile (``~/.config/google-chrome`` in the slot's
home, so a reset wipes it) and a debugging port picked free per launch; the forwarder is not
needed. Tabs are listed, opened and closed through the HTTP ``/json`` endpoints; a page's
DOM is read with ``Runtime.evaluate`` over the target's websocket.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import socket
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from dart.errors import EnvError, ToolMissing

CHROME_NAMES = ("google-chrome", "google-chrome-stable", "chromium", "chromium-browser", "chrome")
PROFILE_DIR = ".config/google-chrome"
"""The profile folder inside the slot's home (where OSWorld's getters look for it)."""
CDP_TIMEOUT_S = 10.0
"""Time limit of one DevTools request."""


def chromium_binary() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if path := shutil.which(name):
            return path
    raise ToolMissing("chromium not found: apt-get install chromium (or `make system-deps-desktop`)")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Chrome:
    """The browser of one slot: its profile folder and, once launched, its DevTools port."""

    home: Path
    port: int | None = None
    extra_args: tuple[str, ...] = ("--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage")
    """--no-sandbox: the env workers run as root in CI containers, where Chromium's sandbox cannot start."""
    _session: aiohttp.ClientSession | None = field(default=None, repr=False)

    @property
    def profile(self) -> Path:
        return self.home / PROFILE_DIR

    def argv(self, task_argv: list[str]) -> list[str]:
        """The command that stands for a task's ``google-chrome ...``: its URLs and flags kept,
        the debugging port replaced by a free one, the slot's profile, no first-run dialogs."""
        self.port = free_port()
        kept = [a for a in task_argv[1:] if not a.startswith(("--remote-debugging-port", "--user-data-dir"))]
        return [chromium_binary(), f"--remote-debugging-port={self.port}", f"--user-data-dir={self.profile}",
                "--no-first-run", "--no-default-browser-check", "--password-store=basic",
                "--disable-features=Translate,MediaRouter", *self.extra_args, *kept]

    @property
    def base(self) -> str:
        if self.port is None:
            raise EnvError("Chrome is not running on this slot (no launch step started it)")
        return f"http://127.0.0.1:{self.port}"

    async def _http(self, method: str, path: str) -> Any:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=CDP_TIMEOUT_S))
        try:
            async with self._session.request(method, self.base + path) as resp:
                text = await resp.text()
                if resp.status >= 400:
                    raise EnvError(f"DevTools {method} {path}: HTTP {resp.status} {text[:200]}")
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise EnvError(f"DevTools {method} {path} failed: {exc}") from exc
        try:
            return json.loads(text)
        except ValueError:
            return text

    async def wait_ready(self, timeout_s: float) -> None:
        """Until the DevTools endpoint answers (the browser is up)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while True:
            try:
                await self._http("GET", "/json/version")
                return
            except EnvError:
                if loop.time() > deadline:
                    raise EnvError(f"Chromium's DevTools port {self.port} did not answer within {timeout_s} s") from None
                await asyncio.sleep(0.3)

    async def pages(self) -> list[dict[str, Any]]:
        """Open tabs, most recently active first (the order the /json endpoint lists them)."""
        return [t for t in await self._http("GET", "/json/list") if t.get("type") == "page"]

    async def open_tab(self, url: str) -> dict[str, Any]:
        return await self._http("PUT", "/json/new?" + urllib.parse.quote(url, safe=":/?&=#%@+,;~"))

    async def close_tab(self, target_id: str) -> None:
        await self._http("GET", f"/json/close/{target_id}")

    async def active_page(self) -> dict[str, Any] | None:
        pages = await self.pages()
        return pages[0] if pages else None

    async def send(self, page: dict[str, Any], method: str, params: dict[str, Any] | None = None) -> Any:
        """One DevTools command on ``page``'s websocket; its ``result``."""
        ws_url = page.get("webSocketDebuggerUrl")
        if not ws_url:
            raise EnvError(f"tab {page.get('url')} has no DevTools websocket (another client holds it?)")
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=CDP_TIMEOUT_S))
        data: dict[str, Any] = {}
        try:
            async with self._session.ws_connect(ws_url, max_msg_size=64 << 20) as ws:
                await ws.send_json({"id": 1, "method": method, "params": params or {}})
                async for frame in ws:
                    data = json.loads(frame.data)
                    if data.get("id") == 1:
                        break
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise EnvError(f"DevTools {method} on {page.get('url')} failed: {exc}") from exc
        if "error" in data:
            raise EnvError(f"DevTools {method} on {page.get('url')}: {data['error'].get('message')}")
        return data.get("result", {})

    async def evaluate(self, page: dict[str, Any], expression: str) -> Any:
        """The value of a JavaScript expression in ``page`` (by value, awaited if a promise)."""
        result = await self.send(page, "Runtime.evaluate",
                                 {"expression": expression, "returnByValue": True, "awaitPromise": True})
        if "exceptionDetails" in result:
            raise EnvError(f"script failed in {page.get('url')}: {result['exceptionDetails'].get('text')}")
        return result.get("result", {}).get("value")

    async def wait_loaded(self, page: dict[str, Any], timeout_s: float = 20.0) -> None:
        """Wait until ``page``'s document has loaded (OSWorld's getters wait for Playwright's
        ``load`` state before reading a page). A page still loading at ``timeout_s`` is read as
        it is, as OSWorld does after its own timeout."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while loop.time() < deadline:
            try:
                state = await self.evaluate(page, "[document.readyState, location.href]")
                # a tab opened by URL shows that URL before its first document replaces about:blank
                if (state and state[0] == "complete"
                        and (state[1] != "about:blank" or page.get("url") == "about:blank")):
                    return
            except EnvError:
                pass  # a navigation replaced the context mid-call: ask again
            await asyncio.sleep(0.1)

    async def open_tabs(self, urls: list[str]) -> None:
        """Open ``urls`` as OSWorld does: the first in the start tab, the others in new tabs."""
        pages = await self.pages()
        start = next((p for p in pages if p.get("url", "").startswith(("chrome://new", "about:blank"))), None)
        for i, url in enumerate(urls):
            if i == 0 and start is not None and len(pages) == 1:
                await self.send(start, "Page.navigate", {"url": url})
            else:
                await self.open_tab(url)

    async def close_tabs(self, urls: list[str], timeout_s: float = 10.0) -> None:
        """Close the first tab showing each URL (trailing slashes aside) and wait until it is
        gone. A tab opened just before may not show its URL yet: wait for it up to ``timeout_s``,
        and for its document to load (OSWorld opened it with Playwright's ``goto``, which waits
        for the load): a tab closed before its navigation committed leaves Chromium nothing to
        reopen, and Ctrl+Shift+T (task 06fe7178) then brought nothing back."""
        loop = asyncio.get_running_loop()
        for url in urls:
            deadline = loop.time() + timeout_s
            page = None
            while page is None and loop.time() < deadline:
                pages = await self.pages()
                page = next((p for p in pages if p.get("url", "").rstrip("/") == url.rstrip("/")), None)
                if page is None:
                    await asyncio.sleep(0.2)
            if page is None:
                raise EnvError(f"chrome_close_tabs: no tab shows {url} (open: {[p.get('url') for p in pages]})")
            await self.wait_loaded(page)
            await self.close_tab(page["id"])
            while any(p["id"] == page["id"] for p in await self.pages()) and loop.time() < deadline:
                await asyncio.sleep(0.1)

    async def add_history(self, entries: list[dict[str, Any]], timeout_s: float = 90.0) -> None:
        """OSWorld's ``update_browse_history``: visits (``url``, ``title``,
        ``visit_time_from_now_in_seconds`` ago) in the profile's History, before the browser
        starts. A headless run creates the profile first, so the database has Chromium's own
        schema (a hand-made one would be thrown away by the browser)."""
        if self.port is not None:
            raise EnvError("update_browse_history must run before Chrome starts (the browser locks History)")
        db = self.profile / "Default" / "History"
        if not db.exists():
            proc = await asyncio.create_subprocess_exec(
                chromium_binary(), "--headless", f"--user-data-dir={self.profile}", *self.extra_args,
                "--dump-dom", "about:blank", stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL)
            try:
                await asyncio.wait_for(proc.wait(), timeout_s)
            except TimeoutError as exc:
                proc.kill()
                await proc.wait()
                raise EnvError(f"headless Chromium did not create a profile within {timeout_s} s") from exc
        if not db.exists():
            raise EnvError(f"headless Chromium left no History database in {self.profile}")
        await asyncio.to_thread(_insert_visits, db, entries)

    def read_json(self, relative: str) -> Any:
        """A JSON file of the profile (``Default/Preferences``, ``Local State``, ...); {} if absent."""
        try:
            return json.loads((self.profile / relative).read_text(encoding="utf-8"))
        except FileNotFoundError:
            return {}
        except ValueError as exc:
            raise EnvError(f"Chrome profile file {relative} is not JSON: {exc}") from exc

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
        self.port = None


WEBKIT_EPOCH_OFFSET_S = 11_644_473_600
"""Seconds from 1601-01-01 (Chromium's time origin, in microseconds) to the Unix epoch."""


def _insert_visits(db: Path, entries: list[dict[str, Any]]) -> None:
    import sqlite3
    import time

    now_us = int((time.time() + WEBKIT_EPOCH_OFFSET_S) * 1_000_000)
    conn = sqlite3.connect(db)
    try:
        with conn:
            for e in entries:
                when = now_us - int(float(e.get("visit_time_from_now_in_seconds", 0)) * 1_000_000)
                cur = conn.execute(
                    "INSERT INTO urls (url, title, visit_count, typed_count, last_visit_time, hidden) "
                    "VALUES (?, ?, 1, 0, ?, 0)", (e["url"], e.get("title", ""), when))
                conn.execute("INSERT INTO visits (url, visit_time, transition) VALUES (?, ?, 805306368)",
                             (cur.lastrowid, when))  # PAGE_TRANSITION_LINK | CHAIN_START | CHAIN_END
    finally:
        conn.close()
