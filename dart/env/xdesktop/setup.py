"""OSWorld setup steps on a local X display: launch, open, execute / command, sleep, download
(files shipped with the tasks), write_file, activate_window.

Commands are argv lists run without a shell (a string is split with shlex, never handed to
a shell). Paths that start with ``~/`` or ``/home/user/`` (OSWorld's home) mean the slot's
own home folder. LibreOffice always gets the slot's own profile, so two slots never share
one running office (a second ``soffice`` would hand its document to the first one's display).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from dart.env.downloads import DownloadCache, is_remote
from dart.env.xdesktop.chrome import CHROME_NAMES, Chrome, free_port
from dart.env.xdesktop.display import XDisplay
from dart.errors import ConfigError, EnvError

log = logging.getLogger(__name__)

SETUP_TYPES = ("launch", "open", "execute", "command", "sleep", "download", "write_file", "activate_window",
               "chrome_open_tabs", "chrome_close_tabs", "close_window", "update_browse_history")
POSTCONFIG_WINDOW_WAIT_S = 10.0
"""How long an evaluator's activate_window / close_window waits for the agent's window."""
STAND_INS = {"nautilus": "pcmanfm", "gnome-terminal": "xterm"}
"""GNOME apps OSWorld's setup opens only to show the agent a folder or a shell, and the Debian
programs that stand in for them on a bare X desktop (the evaluators read files, not these apps)."""
_GNOME_TERMINAL = re.compile(r"gnome-terminal(?: --maximize)?(?: --working-directory=(\S+))?")
UNAVAILABLE_PROGRAMS = {
    "code": "VS Code is not packaged by Debian (only Microsoft's own repository has it)",
    "gsettings": "GNOME settings need a GNOME session (dconf); without one nothing persists",
    "timedatectl": "the machine's clock is not the slot's to change (and needs systemd)",
    "apt": "would install packages on the host: slots share this machine",
    "apt-get": "would install packages on the host: slots share this machine",
}
"""Programs OSWorld tasks run that an X desktop slot cannot offer: their tasks are refused."""
OSWORLD_HOME = "/home/user"
TASKS_DIR = Path(__file__).resolve().parent / "tasks"
"""Local tasks (``*.json``) and the files they ship (``files/``)."""

_CALC = (".xlsx", ".xls", ".ods", ".csv")
_IMPRESS = (".pptx", ".ppt", ".odp")
_WRITER = (".docx", ".doc", ".odt", ".rtf")
_OFFICE = ("soffice", "libreoffice", "localc", "lowriter")


def resolve_path(path: str, home: Path) -> Path:
    """A task path on this machine: ``~/x`` and ``/home/user/x`` live in the slot's home."""
    if path == "~" or path.startswith("~/"):
        return home / path[2:]
    if path == OSWORLD_HOME or path.startswith(OSWORLD_HOME + "/"):
        return home / path[len(OSWORLD_HOME) + 1 :]
    p = Path(path)
    if not p.is_absolute():
        return home / p
    return p


def expand_argv(argv: Sequence[str], home: Path) -> list[str]:
    """Home-relative task paths in a command line made absolute for this slot."""
    return [str(resolve_path(a, home)) if a.startswith(("~/", OSWORLD_HOME + "/")) else a for a in argv]


def command_of(params: dict[str, Any], where: str) -> list[str]:
    raw = params.get("command")
    if isinstance(raw, str) and raw.strip():
        return shlex.split(raw)
    if isinstance(raw, list) and raw and all(isinstance(a, str) for a in raw):
        return list(raw)
    raise ConfigError(f"{where}: 'command' must be an argv list or a string, got {raw!r}")


def office_argv(argv: list[str], profile: Path) -> list[str]:
    """Give LibreOffice the slot's own profile (and no restore / first-start dialogs)."""
    if not argv or PurePosixPath(argv[0]).name not in _OFFICE:
        return argv
    seed_office_profile(profile)
    extra = [a for a in (f"-env:UserInstallation={profile.as_uri()}", "--norestore", "--nologo",
                         "--nofirststartwizard") if a not in argv]
    if not any(a.startswith("-env:UserInstallation=") for a in argv[1:]):
        return [argv[0], *extra, *argv[1:]]
    return [argv[0], *[a for a in extra if not a.startswith("-env:")], *argv[1:]]


_OFFICE_SETTINGS = """<?xml version="1.0" encoding="UTF-8"?>
<oor:items xmlns:oor="http://openoffice.org/2001/registry" xmlns:xs="http://www.w3.org/2001/XMLSchema"
 xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance">
<item oor:path="/org.openoffice.Office.Common/Save/Document"><prop oor:name="WarnAlienFormat" oor:op="fuse"><value>false</value></prop></item>
<item oor:path="/org.openoffice.Office.Common/Misc"><prop oor:name="ShowTipOfTheDay" oor:op="fuse"><value>false</value></prop></item>
<item oor:path="/org.openoffice.Office.Common/Misc"><prop oor:name="FirstRun" oor:op="fuse"><value>false</value></prop></item>
<item oor:path="/org.openoffice.Office.Impress/Misc/NewDoc"><prop oor:name="AutoPilot" oor:op="fuse"><value>false</value></prop></item>
</oor:items>
"""


OFFICE_HOME_PROFILE = ".config/libreoffice/4"
"""Where OSWorld's Ubuntu keeps LibreOffice's profile, relative to the home (its evaluators read
``user/registrymodifications.xcu`` there)."""


def seed_office_profile(profile: Path, *, fresh_settings: bool = False) -> None:
    """A new LibreOffice profile that saves .xlsx without the 'Keep current format?' dialog
    (a dialog whose timing made scripted saves flaky under load), shows no tip of the day, and
    starts Impress on its slide, not in the modal 'Select a Template' dialog (which held the
    focus from the main window for minutes in a CI run).
    ``fresh_settings``: put those settings back even where the profile has some (a reset: what
    the previous task's agent set must not leak into the next task)."""
    settings = profile / "user" / "registrymodifications.xcu"
    if fresh_settings or not settings.exists():
        settings.parent.mkdir(parents=True, exist_ok=True)
        settings.write_text(_OFFICE_SETTINGS, encoding="utf-8")


def link_office_profile(home: Path, profile: Path) -> None:
    """The slot's LibreOffice profile lives outside its home (its caches survive resets, so an
    office app need not build one on each start); a link at OSWorld's place for it lets the agent's edits and the
    evaluators' reads of ``~/.config/libreoffice/4/user/...`` reach the profile LibreOffice uses."""
    link = home / OFFICE_HOME_PROFILE
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(profile, target_is_directory=True)


def open_argv(path: Path, profile: Path) -> list[str]:
    """The app that opens ``path``: LibreOffice for office files, mousepad for the rest."""
    suffix = path.suffix.lower()
    if suffix in _CALC:
        return office_argv(["soffice", "--calc", str(path)], profile)
    if suffix in _WRITER:
        return office_argv(["soffice", "--writer", str(path)], profile)
    if suffix in _IMPRESS:
        return office_argv(["soffice", "--impress", str(path)], profile)
    return ["mousepad", str(path)]


class SetupRunner:
    """Runs setup (and postconfig) steps for one slot."""

    def __init__(self, display: XDisplay, *, profile: Path, tasks_dir: Path = TASKS_DIR,
                 app_timeout_s: float = 60.0, ready_s: float = 1.0, command_timeout_s: float = 60.0,
                 downloads: DownloadCache | None = None) -> None:
        self.display = display
        self.downloads = downloads or DownloadCache()
        self.chrome = Chrome(display.home)
        self.vlc = Vlc()
        self.cache_dir = profile.parent / "cache"
        """Where ``execute`` steps with ``stdout`` leave their output (read by ``cache_file``)."""
        self._apps: list[tuple[str, subprocess.Popen[bytes]]] = []
        self.profile = profile
        self.tasks_dir = tasks_dir
        self.app_timeout_s = app_timeout_s
        self.ready_s = ready_s
        self.command_timeout_s = command_timeout_s

    @property
    def home(self) -> Path:
        return self.display.home

    async def reset(self) -> None:
        """Forget the previous task's apps, browser and command outputs (the display has
        already stopped the apps)."""
        self._apps.clear()
        self.vlc.port = None
        await self.chrome.close()
        await asyncio.to_thread(shutil.rmtree, self.cache_dir, True)

    async def run(self, step_type: str, params: dict[str, Any], *, postconfig: bool = False) -> None:
        """One step. ``postconfig``: a step of the evaluator, whose commands often look at what the
        agent made (``ls`` of a folder it should have created): their exit status is not an
        environment failure there, as in OSWorld, unless the task sets ``check``."""
        where = f"setup step {step_type!r}"
        if postconfig:
            params = {"check": False, **params}
            if step_type in ("activate_window", "close_window"):
                # The window is the agent's (a document it should have saved): when it is not
                # there, there is nothing to focus, and the getters find what they find.
                try:
                    await asyncio.wait_for(self.run(step_type, params), POSTCONFIG_WINDOW_WAIT_S)
                except (EnvError, TimeoutError) as exc:
                    log.info("postconfig %s: %s", step_type, exc)
                return
        match step_type:
            case "launch":
                await self._launch(self._osworld_argv(self._command(params, where)), params)
            case "open":
                path = resolve_path(_str(params, "path", where), self.home)
                if not path.exists():
                    raise EnvError(f"{where}: {path} does not exist (a download or write_file step must create it)")
                self.display.launch(open_argv(path, self.profile))
                await self._ready(re.escape(path.name))
            case "execute" | "command":
                await self._execute(self._osworld_argv(self._command(params, where)), params)
            case "sleep":
                await asyncio.sleep(float(params.get("seconds", 1.0)))
            case "download":
                for f in params.get("files", []):
                    await asyncio.to_thread(self._fetch, _str(f, "url", where), _str(f, "path", where))
            case "write_file":
                target = resolve_path(_str(params, "path", where), self.home)
                content = params.get("content", "")
                data = json.dumps(content) if not isinstance(content, str) else content
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_text(data, encoding="utf-8")
            case "update_browse_history":
                await self.chrome.add_history(list(params.get("history", [])))
            case "chrome_open_tabs":
                await self.chrome.wait_ready(self.app_timeout_s)
                home_url = "file://" + OSWORLD_HOME + "/"
                urls = [f"file://{self.home}/{u[len(home_url):]}" if u.startswith(home_url) else u
                        for u in params.get("urls_to_open", [])]
                await self.chrome.open_tabs(urls)
            case "chrome_close_tabs":
                await self.chrome.wait_ready(self.app_timeout_s)
                await self.chrome.close_tabs(list(params.get("urls_to_close", [])))
            case "close_window":
                await self._close_window(_str(params, "window_name", where), by_class=_flag(params, "by_class"))
            case "activate_window":
                name, by_class = _str(params, "window_name", where), _flag(params, "by_class")
                wid = await self.display.wait_window(class_pattern(name) if by_class else window_pattern(name),
                                                     self.app_timeout_s, by_class=by_class)
                proc = await asyncio.create_subprocess_exec("xdotool", "windowactivate", "--sync", wid,
                                                            env=self.display.env)
                await proc.wait()
            case _:
                raise ConfigError(f"the xdesktop backend cannot run setup step {step_type!r} "
                                  f"(supported: {', '.join(SETUP_TYPES)})")

    def _command(self, params: dict[str, Any], where: str) -> list[str]:
        """A step's argv; a string with OSWorld's ``"shell": true`` runs in bash (task files are
        configuration, never model text), without the VM's ``echo PASSWORD | sudo -S`` prefix:
        the slot's programs run as this machine's user."""
        raw = params.get("command")
        if isinstance(raw, str) and str(params.get("shell", "")).lower() in ("true", "1"):
            raw = re.sub(r"echo \{CLIENT_PASSWORD\} \| sudo -S ", "", raw).replace(OSWORLD_HOME, str(self.home))
            if any(c in raw for c in "|;&<>$`(~\n"):  # a real shell line; plain ones stay argv (vlc, chrome)
                return ["/bin/bash", "-c", raw]
            params = {**params, "command": raw}
        return expand_argv(command_of(params, where), self.home)

    def _osworld_argv(self, argv: list[str]) -> list[str]:
        """OSWorld's screen placeholders filled in; ``python`` is this interpreter, which has
        pyautogui (the tasks' scripts press keys with it, on this slot's DISPLAY)."""
        sizes = {"{SCREEN_WIDTH_HALF}": str(self.display.width // 2),
                 "{SCREEN_HEIGHT_HALF}": str(self.display.height // 2),
                 "{SCREEN_WIDTH}": str(self.display.width), "{SCREEN_HEIGHT}": str(self.display.height)}
        out = []
        for a in argv:
            for k, v in sizes.items():
                a = a.replace(k, v)
            out.append(a)
        if out and PurePosixPath(out[0]).name in ("python", "python3"):
            out[0] = sys.executable
        return out

    async def _launch(self, argv: list[str], params: dict[str, Any]) -> None:
        while argv and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", argv[0]):
            argv = argv[1:]  # "VLC_VERBOSE=-1 vlc ...": a shell's variable prefix, only log levels here
        if not argv:
            raise ConfigError(f"launch: no command in {params!r}")
        name = PurePosixPath(argv[0]).name
        if name in ("pkill", "killall") and len(argv) == 2:
            await self._pkill(argv[1])  # OSWorld launches `pkill chrome` too
            return
        if name in STAND_INS:
            argv = [STAND_INS[name], *argv[1:]]
        if name == "socat":
            return  # OSWorld's forwarder to the DevTools port; this backend talks to the port itself
        if name in CHROME_NAMES:
            argv = self.chrome.argv(argv)
        if name in ("vlc", "cvlc"):
            argv = self.vlc.argv(argv)
        self._apps.append((name, self.display.launch(office_argv(argv, self.profile))))
        if name in CHROME_NAMES:
            await self.chrome.wait_ready(self.app_timeout_s)
            await self._ready(window_pattern("Google Chrome"))
        if isinstance(params.get("window"), str):
            await self._ready(window_pattern(params["window"]))

    async def _pkill(self, pattern: str) -> None:
        """OSWorld's ``pkill chrome`` / ``pkill vlc``: stop this slot's matching apps only (a real
        pkill would reach every slot on the machine)."""
        alias = {"chrome": ("google-chrome", "chromium"), "soffice": ("libreoffice",),
                 "gnome-terminal-server": ("gnome-terminal",)}
        names = (pattern, *alias.get(pattern, ()))
        for name, proc in self._apps:
            if any(n in name for n in names) and proc.poll() is None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, signal.SIGTERM)
                await asyncio.to_thread(_wait, proc, 5.0)
        if "chrom" in pattern:
            await self.chrome.close()

    async def _close_window(self, name: str, *, by_class: bool = False) -> None:
        pattern = class_pattern(name) if by_class else window_pattern(name)
        wid = await self.display.wait_window(pattern, self.app_timeout_s, by_class=by_class)
        proc = await asyncio.create_subprocess_exec("xdotool", "windowclose", wid, env=self.display.env)
        await proc.wait()

    async def _ready(self, window: str) -> None:
        await self.display.wait_window(window, self.app_timeout_s)
        await asyncio.sleep(self.ready_s)  # a mapped window is not yet a window that takes keys

    async def _execute(self, argv: list[str], params: dict[str, Any]) -> None:
        if argv[:2] == ["/bin/bash", "-c"] and len(argv) == 3:
            script = argv[2]
            if m := re.fullmatch(r"\s*(?:pkill|killall) ([\w.-]+)\s*", script):
                argv = ["pkill", m.group(1)]
            elif m := _GNOME_TERMINAL.search(script):  # a terminal window: an app, not a command to wait for
                cwd = m.group(1) or str(self.home)
                self._apps.append(("gnome-terminal", self.display.launch(
                    ["/bin/bash", "-c", f"cd {shlex.quote(cwd)} && exec xterm -maximized"])))
                await self._ready("xterm|" + re.escape(PurePosixPath(cwd).name or "/"))
                return
        if len(argv) == 2 and PurePosixPath(argv[0]).name in ("pkill", "killall"):
            await self._pkill(argv[1])
            return
        if argv and PurePosixPath(argv[0]).name == "su":
            # `sudo su - charles` (an infeasible task's premise: no such user): the slot's programs
            # run as this machine's user, and OSWorld's VM runs it and ignores its failure.
            log.info("setup: not switching user (%s): a slot's programs run as this machine's user", shlex.join(argv))
            return
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv, env=self.display.env, cwd=str(self.home),
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            )
        except OSError as exc:
            raise EnvError(f"setup command {argv[0]!r} cannot start: {exc}") from exc
        try:
            out, err = await asyncio.wait_for(proc.communicate(), float(params.get("timeout", self.command_timeout_s)))
        except TimeoutError as exc:
            proc.kill()
            await proc.wait()
            raise EnvError(f"setup command {argv[0]!r} timed out") from exc
        if isinstance(params.get("stdout"), str):  # OSWorld keeps it for a cache_file getter
            self.cache_dir.mkdir(parents=True, exist_ok=True)
            (self.cache_dir / PurePosixPath(params["stdout"]).name).write_bytes(out)
        if proc.returncode != 0 and params.get("check", True):
            raise EnvError(f"setup command {argv!r} failed (exit {proc.returncode}): {err.decode()[-300:]}")

    def _fetch(self, url: str, path: str) -> None:
        if is_remote(url):  # from the download cache (`dart tasks fetch`), never the network
            self.downloads.copy_to(url, resolve_path(path, self.home))
            return
        source = Path(url[len("file://") :]) if url.startswith("file://") else self.tasks_dir / url
        if not source.is_file():
            raise EnvError(f"download: no file {source}")
        target = resolve_path(path, self.home)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, target)


def _str(params: Any, key: str, where: str) -> str:
    value = params.get(key) if isinstance(params, dict) else None
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{where}: {key!r} must be a non-empty string, got {value!r}")
    return value


@dataclass
class Vlc:
    """VLC with its HTTP interface on a free port (what ``vlc_playing_info`` reads)."""

    port: int | None = None
    password: str = "dart"

    def argv(self, task_argv: list[str]) -> list[str]:
        self.port = free_port()
        return [task_argv[0], "--extraintf=http", "--http-host=127.0.0.1", f"--http-port={self.port}",
                f"--http-password={self.password}", *task_argv[1:]]


def _flag(params: dict[str, Any], key: str) -> bool:
    """A task file's boolean (``true`` or the string ``"true"``)."""
    return str(params.get(key, False)).lower() in ("true", "1")


def class_pattern(name: str) -> str:
    """The xdotool ``--class`` pattern for OSWorld's ``by_class`` window name, which is wmctrl's
    ``instance.Class`` (``Mail.thunderbird``): the class part (Debian's Thunderbird calls its
    class ``thunderbird-default``, which the pattern also matches)."""
    return re.escape(name.split(".", 1)[1] if "." in name else name)


GIMP_TITLE = "GNU Image Manipulation Program"


def window_pattern(name: str) -> str:
    """The xdotool title pattern for an OSWorld window name: Debian's Chromium titles its
    windows "... - Chromium" where Google's build says "Google Chrome"; a terminal is xterm.
    GIMP titles its window "GNU Image Manipulation Program" only while no image is open; with
    one it is "[name] (imported)-1.0 (RGB ...) – GIMP" (the plain title shows for a moment
    while the image loads, and a search can miss it): either one is GIMP's window."""
    pattern = re.escape(name)
    if name == "Terminal":  # GNOME's terminal; the slot's Ctrl+Alt+T opens xterm
        return "Terminal|xterm"
    if name == GIMP_TITLE:
        return f"{pattern}|– GIMP$"
    return pattern.replace("Google\\ Chrome", "(Google\\ Chrome|Chromium)") if "Google Chrome" in name else pattern


def _wait(proc: subprocess.Popen[bytes], timeout_s: float) -> None:
    try:
        proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
