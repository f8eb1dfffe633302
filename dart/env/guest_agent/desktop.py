"""What the guest agent does to the X display it serves: the I/O half of the agent.

Everything here runs programs as argv lists (never a shell) with ``DISPLAY`` set to the
agent's display. Typed actions go through :mod:`dart.env.xdotool`, the same code the
xdesktop backend uses, so a click means the same thing in a VM and on a local desktop.
"""

from __future__ import annotations

import asyncio
import contextlib
import grp
import io
import logging
import os
import pwd
import shutil
import signal
import time
from dataclasses import dataclass
from typing import Any

from dart.agent.actions import Action
from dart.env import xdotool
from dart.errors import EnvError, ToolMissing

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True, slots=True)
class RunResult:
    returncode: int
    stdout: str
    stderr: str
    duration_s: float


def as_user(name: str | None) -> dict[str, Any]:
    """``user``/``group``/``extra_groups`` for ``create_subprocess_exec`` so a child runs as
    ``name`` (the desktop user), or {} for None. EnvError when this process cannot switch user."""
    if name is None:
        return {}
    try:
        pw = pwd.getpwnam(name)
    except KeyError as exc:
        raise EnvError(f"guest agent --run-as {name}: no such user") from exc
    if os.geteuid() not in (0, pw.pw_uid):
        raise EnvError(f"guest agent --run-as {name}: the agent runs as uid {os.geteuid()} and cannot start "
                       "programs as another user; run it as root (or as its own user with CAP_SETUID)")
    groups = [g.gr_gid for g in grp.getgrall() if name in g.gr_mem]
    return {"user": pw.pw_uid, "group": pw.pw_gid, "extra_groups": groups}


class Desktop:
    """One X display: screenshots, input, programs.

    ``run_as`` (the desktop user): every program the agent starts (task commands, launched
    apps, xdotool) runs as that user, so it can read neither the agent's token file nor the
    agent's ``/proc/<pid>/environ`` (the agent and its token belong to another user)."""

    def __init__(self, display: str, *, run_as: str | None = None) -> None:
        self.display = display
        self.env = {**os.environ, "DISPLAY": display}
        self.spawn = as_user(run_as)
        if run_as is not None:
            pw = pwd.getpwnam(run_as)
            self.env.update(HOME=pw.pw_dir, USER=run_as, LOGNAME=run_as)
        self._size: tuple[int, int] | None = None
        self._children: set[asyncio.subprocess.Process] = set()

    async def screenshot_png(self) -> bytes:
        """The whole screen as PNG (fast zlib level: a screenshot is sent once, not archived)."""
        return await asyncio.to_thread(self._grab_png)

    def _grab_png(self) -> bytes:
        from PIL import ImageGrab

        try:
            image = ImageGrab.grab(xdisplay=self.display)
        except OSError as exc:
            raise EnvError(f"cannot grab X display {self.display}: {exc}; is the X server running?") from exc
        self._size = image.size
        buf = io.BytesIO()
        image.save(buf, "PNG", compress_level=1)
        return buf.getvalue()

    async def screen_size(self) -> tuple[int, int]:
        if self._size is None:
            res = await self.run(["xdotool", "getdisplaygeometry"], timeout_s=10)
            parts = res.stdout.split()
            if res.returncode != 0 or len(parts) != 2:
                raise EnvError(f"xdotool getdisplaygeometry failed on {self.display}: {res.stderr.strip()}")
            self._size = (int(parts[0]), int(parts[1]))
        return self._size

    async def cursor_position(self) -> tuple[int, int]:
        res = await self.run(["xdotool", "getmouselocation", "--shell"], timeout_s=10)
        values = dict(line.split("=", 1) for line in res.stdout.splitlines() if "=" in line)
        try:
            return int(values["X"]), int(values["Y"])
        except (KeyError, ValueError) as exc:
            raise EnvError(f"xdotool getmouselocation failed on {self.display}: {res.stderr.strip()}") from exc

    async def act(self, action: Action) -> int:
        """Turn one typed action into input events on this display; returns how many xdotool
        commands ran (0 for actions without input). An unknown key is
        :class:`dart.env.xdotool.UnknownKey` (the caller answers "nothing done")."""
        argvs = xdotool.xdotool_argvs(action, screen=await self.screen_size())
        await xdotool.run_argvs(argvs, env=self.env, spawn=self.spawn)
        return len(argvs)

    async def run(self, argv: list[str] | tuple[str, ...], *, timeout_s: float) -> RunResult:
        """Run a program to completion; a timeout kills its whole process group."""
        if shutil.which(argv[0], path=self.env.get("PATH")) is None and not os.path.exists(argv[0]):
            return RunResult(returncode=127, stdout="", stderr=f"{argv[0]}: command not found", duration_s=0.0)
        t0 = time.perf_counter()
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=self.env,
            start_new_session=True,
            **self.spawn,
        )
        try:
            out, err = await asyncio.wait_for(proc.communicate(), timeout_s)
        except TimeoutError:
            _kill_group(proc.pid)
            await proc.wait()
            return RunResult(
                returncode=124,
                stdout="",
                stderr=f"timed out after {timeout_s:g} s: {argv[0]}",
                duration_s=time.perf_counter() - t0,
            )
        return RunResult(
            returncode=proc.returncode if proc.returncode is not None else -1,
            stdout=out.decode(errors="replace"),
            stderr=err.decode(errors="replace"),
            duration_s=time.perf_counter() - t0,
        )

    async def launch(self, argv: list[str] | tuple[str, ...]) -> int:
        """Start a program in the background (its own session, so it outlives the request)."""
        if shutil.which(argv[0], path=self.env.get("PATH")) is None and not os.path.exists(argv[0]):
            raise ToolMissing(f"{argv[0]}: not installed in the guest; install it in the base image")
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
            env=self.env,
            start_new_session=True,
            **self.spawn,
        )
        self._children.add(proc)
        return proc.pid

    async def close(self) -> None:
        """Stop the programs this agent launched (the display itself belongs to whoever started it)."""
        for proc in list(self._children):
            if proc.returncode is None:
                _kill_group(proc.pid)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(proc.wait(), 5)


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
