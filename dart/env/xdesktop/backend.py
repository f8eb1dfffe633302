"""The xdesktop backend: a real X desktop on this machine, one private display per slot.

Each slot owns a folder with a ``home`` (the HOME of every app it starts; wiped on reset) and a
LibreOffice profile (kept across resets, so Calc starts without building a profile first).
Reset stops the previous task's apps, empties the home and runs the task's setup steps;
actions become xdotool commands (:mod:`dart.env.xdotool`); screenshots come from the X
server. ``read_file`` and ``run_command`` act on this machine's files and processes, with the
slot's DISPLAY and HOME.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dart.agent.actions import Action, Wait
from dart.config import require
from dart.env.backend import CommandResult, EnvBackend, Health, Observation
from dart.env.downloads import DownloadCache
from dart.env.tasks import Task
from dart.env.xdesktop.display import XDisplay
from dart.env.xdesktop.getters import register
from dart.env.xdesktop.setup import (
    TASKS_DIR,
    SetupRunner,
    expand_argv,
    link_office_profile,
    resolve_path,
    seed_office_profile,
)
from dart.env.xdotool import UnknownKey, run_argvs, xdotool_argvs
from dart.errors import EnvError

log = logging.getLogger(__name__)
PAGES_PREMISE = {"is_cookie_deleted": "its pages set the cookies it asks to delete"}
"""Metrics that judge what the setup's web pages left in the browser: their pages must load."""

HOME_FOLDERS = ("Desktop", "Documents", "Downloads", "Music", "Pictures", "Videos")
MIME_DEFAULTS = "[Default Applications]\nvideo/mp4=org.gnome.Totem.desktop\n"
"""OSWorld's Ubuntu opens videos with Totem: a task that asks for VLC starts from there."""
TOTEM_ENTRY = "[Desktop Entry]\nType=Application\nName=Videos\nExec=false %U\nMimeType=video/mp4;\nNoDisplay=true\n"


@dataclass(frozen=True, kw_only=True)
class XDesktopConfig:
    width: int = 1280
    """Screen width in pixels."""
    height: int = 800
    """Screen height in pixels."""
    wm: str = "openbox"
    """Window manager to run on each display ('' for none)."""
    root: str = ""
    """Folder for the slots' homes and profiles ('' = the system temp folder)."""
    tasks_dir: str = ""
    """Where 'download' steps find shipped files ('' = the package's tasks folder)."""
    downloads: str = ""
    """Download cache of files tasks fetch from URLs ('' = $DART_DOWNLOADS or .dart/blobs;
    fill it with `dart tasks fetch`)."""
    type_delay_ms: int = 5
    """Delay between typed keys; LibreOffice drops repeated keys below ~3 ms."""
    scroll_clicks: int = 5
    """Wheel clicks per scroll action."""
    settle_s: float = 0.3
    """Pause after an action before the screenshot (let the app redraw)."""
    wait_s: float = 1.0
    """How long a wait() action waits."""
    app_timeout_s: float = 60.0
    """How long setup waits for an app's window."""
    ready_s: float = 1.0
    """Pause after an app's window appeared, before keys reach it."""
    command_timeout_s: float = 60.0
    """Time limit of setup commands."""

    def __post_init__(self) -> None:
        require(self.width >= 200 and self.height >= 200, "width/height", f"too small: {self.width}x{self.height}")
        require(self.type_delay_ms >= 0, "type_delay_ms", f"must be >= 0, got {self.type_delay_ms}")


class XDesktopBackend(EnvBackend):
    """One slot of a local X desktop. Create, ``await start()`` (or let ``reset`` start it)."""

    name = "xdesktop"

    def __init__(self, cfg: XDesktopConfig | None = None, *, slot: int = 0) -> None:
        self.cfg = cfg or XDesktopConfig()
        self.slot = slot
        base = Path(self.cfg.root) if self.cfg.root else Path(tempfile.gettempdir())
        base.mkdir(parents=True, exist_ok=True)
        self.dir = Path(tempfile.mkdtemp(prefix=f"dart-xdesktop-{slot}-", dir=base))
        self.home = self.dir / "home"
        self.profile = self.dir / "lo-profile"
        self.home.mkdir()
        self.display = XDisplay(width=self.cfg.width, height=self.cfg.height, home=self.home, wm=self.cfg.wm)
        self.setup = SetupRunner(
            self.display, profile=self.profile,
            tasks_dir=Path(self.cfg.tasks_dir) if self.cfg.tasks_dir else TASKS_DIR,
            app_timeout_s=self.cfg.app_timeout_s, ready_s=self.cfg.ready_s,
            command_timeout_s=self.cfg.command_timeout_s,
            downloads=DownloadCache(self.cfg.downloads or None),
        )
        self._started = False
        self._closed = False

    async def start(self) -> None:
        if self._closed:
            raise EnvError(f"xdesktop slot {self.slot} is closed")
        if not self._started:
            await self.display.start()
            self._started = True

    async def reset(self, task: Task | dict[str, Any]) -> Observation:
        task = _as_task(task)
        await self.start()
        await self.display.kill_apps()
        await self.setup.reset()
        await asyncio.to_thread(self._wipe_home)
        for step in task.config:
            await self.setup.run(step.type, step.parameters)
        await self._check_pages_loaded(task)
        return await self._observe({"task": task.id})

    async def _check_pages_loaded(self, task: Task) -> None:
        """A task whose evaluator judges what its setup's web pages left behind (cookies to
        delete) cannot be scored when they did not load (an offline machine): without the
        check it scores 1 before any action. An infra error, naming the pages, instead."""
        why = next((PAGES_PREMISE[f] for f in task.evaluator.funcs if f in PAGES_PREMISE), None)
        if why is None or self.setup.chrome.port is None:
            return
        failed = []
        for page in await self.setup.chrome.pages():
            await self.setup.chrome.wait_loaded(page)
            if str(await self.setup.chrome.evaluate(page, "location.href")).startswith("chrome-error://"):
                history = await self.setup.chrome.send(page, "Page.getNavigationHistory")
                entries = history.get("entries") or [{}]
                failed.append(str(entries[history.get("currentIndex", -1)].get("url") or page.get("url") or "a tab"))
        if failed:
            raise EnvError(f"setup: {', '.join(failed)} did not load (no network?), and this task needs them "
                           f"loaded ({why})")

    async def step(self, action: Action) -> Observation:
        self._check()
        info: dict[str, Any] = {}
        try:
            argvs = xdotool_argvs(action, screen=(self.cfg.width, self.cfg.height),
                                  type_delay_ms=self.cfg.type_delay_ms, scroll_clicks=self.cfg.scroll_clicks)
        except UnknownKey as exc:
            argvs, info["ignored"] = [], str(exc)  # a key the model made up: nothing happens
        await run_argvs(argvs, env=self.display.env)
        await asyncio.sleep(self.cfg.wait_s if isinstance(action, Wait) else self.cfg.settle_s)
        return await self._observe(info)

    async def evaluate(self, task: Task | dict[str, Any], *, final_action: Action | None) -> tuple[float, dict[str, Any]]:
        # Deferred: loads numpy, needed only here.
        from dart.env.evaluators import evaluate_task

        register()
        task = _as_task(task)
        self._check()
        for step in task.evaluator.postconfig:
            await self.setup.run(step.type, step.parameters, postconfig=True)
        return await evaluate_task(task, self, final_action=final_action,
                                   extras={"downloads": self.setup.downloads, "chrome": self.setup.chrome, "vlc": self.setup.vlc,
                                           "cache_dir": self.setup.cache_dir})

    async def health(self) -> Health:
        if self._closed:
            return Health(ok=False, detail="closed")
        if not self._started:
            return Health(ok=True, detail="not started")
        if not self.display.alive():
            return Health(ok=False, detail=f"X display {self.display.display} died")
        try:
            await run_argvs([["xdotool", "getmouselocation"]], env=self.display.env, timeout_s=5.0)
        except EnvError as exc:
            return Health(ok=False, detail=str(exc))
        return Health(ok=True)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        await self.setup.chrome.close()
        await self.display.close()
        await asyncio.to_thread(shutil.rmtree, self.dir, True)

    async def read_file(self, path: str) -> bytes:
        self._check()
        return await asyncio.to_thread(resolve_path(path, self.home).read_bytes)

    async def run_command(self, argv: list[str], *, timeout_s: float = 30.0) -> CommandResult:
        self._check()
        argv = expand_argv(argv, self.home)
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv, env=self.display.env, cwd=str(self.home),
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            )
        except OSError as exc:
            return CommandResult(returncode=127, stdout="", stderr=f"cannot run {argv[0]!r}: {exc}")
        try:
            out, err = await asyncio.wait_for(proc.communicate(), timeout_s)
        except TimeoutError:
            proc.kill()
            await proc.wait()
            return CommandResult(returncode=124, stdout="", stderr=f"timed out after {timeout_s} s")
        return CommandResult(returncode=proc.returncode or 0, stdout=out.decode(errors="replace"),
                             stderr=err.decode(errors="replace"))

    # ------------------------------------------------------------------ internals

    async def _observe(self, info: dict[str, Any]) -> Observation:
        png = await self.display.screenshot_png()
        return Observation(screenshot_png=png, width=self.cfg.width, height=self.cfg.height,
                           info={"display": self.display.display, **info})

    def _wipe_home(self) -> None:
        shutil.rmtree(self.home, ignore_errors=True)
        self.home.mkdir(parents=True, exist_ok=True)
        (self.home / ".Xauthority").touch()  # python-xlib (pyautogui in task scripts) will not start without one
        for folder in HOME_FOLDERS:  # what OSWorld's tasks expect of a user's home
            (self.home / folder).mkdir()
        # Ubuntu's default video player, not this machine's: a stand-in entry (xdg-mime only names
        # a default whose desktop file exists) that a task's agent replaces by choosing VLC.
        apps = self.home / ".config" / "mimeapps.list"
        apps.parent.mkdir(parents=True, exist_ok=True)
        apps.write_text(MIME_DEFAULTS, encoding="utf-8")
        entry = self.home / ".local" / "share" / "applications" / "org.gnome.Totem.desktop"
        entry.parent.mkdir(parents=True, exist_ok=True)
        entry.write_text(TOTEM_ENTRY, encoding="utf-8")
        seed_office_profile(self.profile, fresh_settings=True)
        link_office_profile(self.home, self.profile)

    def _check(self) -> None:
        if self._closed:
            raise EnvError(f"xdesktop slot {self.slot} is closed")
        if not self._started:
            raise EnvError(f"xdesktop slot {self.slot} has not been reset")


def _as_task(task: Task | dict[str, Any]) -> Task:
    return task if isinstance(task, Task) else Task.from_dict(task, domain="xdesktop")
