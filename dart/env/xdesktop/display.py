"""One private X display: Xvfb on a display number it picks itself, a window manager, the
apps launched on it (each in its own process group), and fast screenshots.

Xvfb is started with ``-displayfd`` so the X server itself chooses a free display number
(no race between slots or with other users of the machine). Screenshots come straight from
the X server through Pillow's XCB support (no ImageMagick round trip).
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import logging
import os
import shutil
import signal
import subprocess
from collections.abc import Sequence
from pathlib import Path

from PIL import ImageGrab

from dart.errors import EnvError, ToolMissing

log = logging.getLogger(__name__)

INSTALL_HINT = ("apt-get install xvfb xdotool openbox mousepad libreoffice-calc libreoffice-writer "
                "libreoffice-impress chromium vlc gimp thunderbird xterm pcmanfm (or `make system-deps-desktop`)")


def require_tools(*names: str) -> None:
    """ToolMissing naming the install command unless every program is on PATH."""
    missing = [n for n in names if shutil.which(n) is None]
    if missing:
        raise ToolMissing(f"{', '.join(missing)} not found: {INSTALL_HINT}")


class XDisplay:
    """Xvfb + window manager for one slot. ``await start()``, then ``env`` for child processes."""

    def __init__(self, *, width: int, height: int, home: Path, wm: str = "openbox") -> None:
        self.width = width
        self.height = height
        self.home = home
        self.wm = wm
        self.display = ""
        self._xvfb: subprocess.Popen[bytes] | None = None
        self._wm: subprocess.Popen[bytes] | None = None
        self._apps: list[subprocess.Popen[bytes]] = []

    @property
    def env(self) -> dict[str, str]:
        """Environment for programs on this display: its DISPLAY and the slot's HOME, and no
        session bus (so a GTK app never hands its window to an instance on another display).
        ``MOZ_LEGACY_PROFILES``: Thunderbird opens the profile that ``profiles.ini`` marks
        ``Default=1`` (the one an OSWorld task unpacks), not a new profile of its own for an
        install it has not seen (what it does when the profile was made by another install)."""
        base = {k: v for k, v in os.environ.items() if not k.startswith(("DBUS_", "XDG_RUNTIME", "WAYLAND"))}
        base.update(DISPLAY=self.display, HOME=str(self.home), LANG=base.get("LANG", "C.UTF-8"),
                    NO_AT_BRIDGE="1", MOZ_LEGACY_PROFILES="1")
        return base

    async def start(self, timeout_s: float = 10.0) -> None:
        require_tools("Xvfb", "xdotool", *([self.wm] if self.wm else []))
        read_fd, write_fd = os.pipe()
        try:
            self._xvfb = subprocess.Popen(
                ["Xvfb", "-displayfd", str(write_fd), "-screen", "0", f"{self.width}x{self.height}x24",
                 "-nolisten", "tcp", "-noreset"],
                pass_fds=(write_fd,),
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
        finally:
            os.close(write_fd)
        try:
            number = await asyncio.wait_for(asyncio.to_thread(_read_line, read_fd), timeout_s)
        except TimeoutError as exc:
            await self.close()
            raise EnvError(f"Xvfb did not report a display within {timeout_s} s") from exc
        finally:
            os.close(read_fd)
        if not number.isdigit():
            await self.close()
            raise EnvError(f"Xvfb failed to start (exit {self._xvfb.poll()}); is {INSTALL_HINT.split()[2]} installed?")
        self.display = f":{number}"
        if self.wm:
            self._wm = self._spawn([self.wm, *self._wm_args()])
        log.debug("X display %s (%dx%d) for %s", self.display, self.width, self.height, self.home)

    def _wm_args(self) -> list[str]:
        """openbox: Ctrl+Alt+T opens a terminal and Alt+Tab switches windows, as on OSWorld's Ubuntu desktop.
        The terminal starts in the home (``cd``): openbox's own working directory is the home it
        was started in, which every reset deletes and makes anew."""
        if Path(self.wm).name != "openbox" or shutil.which("xterm") is None:
            return []
        rc = self.home.parent / "openbox-rc.xml"
        rc.write_text(_OPENBOX_RC, encoding="utf-8")
        return ["--config-file", str(rc)]

    def _spawn(self, argv: Sequence[str], cwd: Path | None = None) -> subprocess.Popen[bytes]:
        try:
            return subprocess.Popen(
                list(argv), env=self.env, cwd=str(cwd or self.home), stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
            )
        except OSError as exc:
            raise EnvError(f"cannot start {argv[0]!r} on {self.display}: {exc}") from exc

    def launch(self, argv: Sequence[str]) -> subprocess.Popen[bytes]:
        """Start an app in the background (its own process group, killed by ``kill_apps``)."""
        proc = self._spawn(argv)
        self._apps.append(proc)
        return proc

    async def kill_apps(self, grace_s: float = 2.0) -> None:
        """Stop every launched app and its children (SIGTERM, then SIGKILL after ``grace_s``),
        and what the window manager started for the user (the terminals Ctrl+Alt+T opened, and
        what runs in them): those are the agent's, and must not outlive its episode."""
        apps, self._apps = self._apps, []
        wm_children = _descendants(self._wm.pid) if self._wm is not None and self._wm.poll() is None else []
        await asyncio.gather(*(_stop_group(p, grace_s) for p in apps), _stop_pids(wm_children, grace_s))

    def alive(self) -> bool:
        return (
            self._xvfb is not None
            and self._xvfb.poll() is None
            and (self._wm is None or self._wm.poll() is None)
        )

    async def screenshot_png(self) -> bytes:
        """PNG of the whole screen, straight from the X server."""
        if not self.alive():
            raise EnvError(f"X display {self.display or '(not started)'} is gone")
        return await asyncio.to_thread(self._grab)

    def _grab(self) -> bytes:
        try:
            img = ImageGrab.grab(xdisplay=self.display)
        except OSError as exc:
            raise EnvError(f"cannot grab the screen of {self.display}: {exc}") from exc
        buf = io.BytesIO()
        img.save(buf, format="PNG", compress_level=1)
        return buf.getvalue()

    async def wait_window(self, name: str, timeout_s: float, *, by_class: bool = False) -> str:
        """The id of a visible window whose title contains ``name`` (a regex, as xdotool takes it);
        ``by_class``: whose WM_CLASS does (OSWorld's ``"by_class": true``, e.g. ``Mail.thunderbird``).

        NOTE: ``xdotool search --sync`` can return empty-handed when a window it was looking at
        disappears mid-search (browsers map and unmap windows while starting): search again."""
        what = "of a class" if by_class else "named"
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while True:
            proc = await asyncio.create_subprocess_exec(
                "xdotool", "search", "--sync", "--onlyvisible", "--class" if by_class else "--name", name,
                env=self.env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL,
            )
            try:
                out, _ = await asyncio.wait_for(proc.communicate(), max(0.1, deadline - loop.time()))
            except TimeoutError as exc:
                raise EnvError(f"no window {what} like {name!r} appeared on {self.display} within {timeout_s} s") from exc
            finally:  # a timeout, or a caller's own (a postconfig's short wait cancels this one)
                if proc.returncode is None:
                    proc.kill()
                    await asyncio.shield(proc.wait())
            ids = out.decode().split()
            if ids:
                return ids[0]
            if loop.time() >= deadline:
                raise EnvError(f"no window {what} like {name!r} on {self.display}")
            await asyncio.sleep(0.2)

    async def close(self) -> None:
        await self.kill_apps(grace_s=1.0)
        for proc in (self._wm, self._xvfb):
            if proc is not None:
                await _stop_group(proc, 1.0)
        self._wm = self._xvfb = None


_OPENBOX_RC = """<?xml version="1.0" encoding="UTF-8"?>
<openbox_config xmlns="http://openbox.org/3.4/rc">
  <keyboard>
    <keybind key="C-A-t"><action name="Execute"><command>sh -c 'cd; exec xterm -fa Monospace -fs 12'</command></action></keybind>
    <keybind key="A-Tab"><action name="NextWindow"><finalactions><action name="Focus"/><action name="Raise"/></finalactions></action></keybind>
  </keyboard>
</openbox_config>
"""


def _read_line(fd: int) -> str:
    data = b""
    while not data.endswith(b"\n"):
        chunk = os.read(fd, 64)
        if not chunk:
            break
        data += chunk
    return data.decode().strip()


async def _stop_group(proc: subprocess.Popen[bytes], grace_s: float) -> None:
    if proc.poll() is not None:
        _kill_group(proc.pid, signal.SIGKILL)  # children may outlive their parent
        return
    _kill_group(proc.pid, signal.SIGTERM)
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(asyncio.to_thread(proc.wait), grace_s)
    _kill_group(proc.pid, signal.SIGKILL)
    await asyncio.to_thread(proc.wait)


def _descendants(pid: int) -> list[int]:
    """Every living process under ``pid`` (children first-level first), from /proc."""
    parent: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue  # gone meanwhile
        # "pid (comm) state ppid ...": comm may hold spaces and parentheses, so split after the last ')'
        ppid = int(stat[stat.rindex(b")") + 2:].split()[1])
        parent.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], list(parent.get(pid, []))
    while todo:
        child = todo.pop(0)
        out.append(child)
        todo.extend(parent.get(child, []))
    return out


async def _stop_pids(pids: list[int], grace_s: float) -> None:
    """SIGTERM to each of ``pids``, SIGKILL to those still there after ``grace_s``."""
    if not pids:
        return
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGTERM)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + grace_s
    while loop.time() < deadline and any(_alive(p) for p in pids):
        await asyncio.sleep(0.05)
    for pid in pids:
        if _alive(pid):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)


def _alive(pid: int) -> bool:
    """Not yet reaped and not a zombie (the window manager reaps its children when it gets to it)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return False
    return stat[stat.rindex(b")") + 2:stat.rindex(b")") + 3] != b"Z"


def _kill_group(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)
