"""The built-in getters: files and command output from inside the environment, and rules.

Every environment access goes through :class:`~dart.env.backend.EnvAccess`. A file the agent
did not create is a value (``None``, so its metric scores 0); an environment that fails is an
exception (an infra error, never a score).
"""

from __future__ import annotations

import asyncio
import shlex
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dart.env.downloads import DownloadCache
from dart.env.evaluators.files import FileContent
from dart.env.evaluators.registry import EvalContext, register_getter
from dart.errors import ConfigError

if TYPE_CHECKING:
    from dart.env.backend import EnvAccess

COMMAND_TIMEOUT_S = 60.0
"""Default time limit of a getter's command (a task may set ``timeout``)."""


def _truthy(v: Any) -> bool:
    """OSWorld writes flags as true or "true"."""
    return v is True or (isinstance(v, str) and v.strip().lower() in ("true", "1", "yes"))


async def _read(env: EnvAccess, path: Any) -> FileContent | None:
    if not isinstance(path, str) or not path:
        raise ConfigError(f"vm_file: path must be a non-empty string, got {path!r}")
    try:
        return FileContent(path, await env.read_file(path))
    except FileNotFoundError:
        return None


@register_getter("vm_file")
async def vm_file(env: EnvAccess, params: dict[str, Any], ctx: EvalContext) -> Any:
    """A file (FileContent, or None if it is missing). With a list of paths (OSWorld ``multi``):
    the files at the indices in ``gives`` (default all); one file if ``gives`` names one."""
    path = params.get("path")
    if not isinstance(path, list):
        return await _read(env, path)
    files = [await _read(env, p) for p in path]
    gives = params.get("gives", list(range(len(files))))
    if not isinstance(gives, list) or not all(isinstance(i, int) and 0 <= i < len(files) for i in gives):
        raise ConfigError(f"vm_file: gives must list indices into path, got {gives!r}")
    picked = [files[i] for i in gives]
    return picked[0] if len(picked) == 1 else picked


def command_argv(command: str | Sequence[str], *, shell: Any = False) -> list[str]:
    """The argv a getter's ``command`` stands for.

    A list is used as is. A string is split with shlex, never handed to a shell — unless the
    task file itself says ``"shell": true`` (OSWorld's own flag, set by task authors for
    pipelines like ``gsettings get ... | grep ...``), which becomes ``["/bin/bash", "-c", cmd]``
    run *inside* the environment, exactly as list-form OSWorld tasks already spell it.
    Task files are configuration, not model text: model text never reaches this function.
    """
    if isinstance(command, str):
        if not command.strip():
            raise ConfigError("vm_command_line: empty command")
        if _truthy(shell):
            return ["/bin/bash", "-c", command]
        try:
            return shlex.split(command)
        except ValueError as exc:
            raise ConfigError(f"vm_command_line: cannot split {command!r}: {exc}") from exc
    if isinstance(command, Sequence) and command and all(isinstance(a, str) for a in command):
        return list(command)
    raise ConfigError(f"vm_command_line: command must be a string or a list of strings, got {command!r}")


async def _run(env: EnvAccess, params: dict[str, Any]):
    argv = command_argv(params.get("command", ""), shell=params.get("shell", False))
    timeout = params.get("timeout", COMMAND_TIMEOUT_S)
    return await env.run_command(argv, timeout_s=float(timeout))


@register_getter("vm_command_line")
async def vm_command_line(env: EnvAccess, params: dict[str, Any], ctx: EvalContext) -> str:
    """The command's standard output (whatever its exit status, as OSWorld does)."""
    return (await _run(env, params)).stdout


@register_getter("vm_command_error")
async def vm_command_error(env: EnvAccess, params: dict[str, Any], ctx: EvalContext) -> str:
    """The command's standard error."""
    return (await _run(env, params)).stderr


@register_getter("rule")
async def rule(env: EnvAccess, params: dict[str, Any], ctx: EvalContext) -> Any:
    """The task's literal ``rules`` object (what ``exact_match`` and friends compare against)."""
    if "rules" not in params:
        raise ConfigError("rule getter without 'rules'")
    return params["rules"]


def _downloads(ctx: EvalContext) -> Any:
    cache = ctx.extras.get("downloads")
    return cache if cache is not None else DownloadCache()


async def _cached(ctx: EvalContext, url: Any, where: str) -> FileContent:
    if not isinstance(url, str) or not url:
        raise ConfigError(f"{where}: path must be a URL, got {url!r}")
    cache = _downloads(ctx)
    return FileContent(url, await asyncio.to_thread(cache.read, url))


@register_getter("cloud_file")
async def cloud_file(env: EnvAccess, params: dict[str, Any], ctx: EvalContext) -> Any:
    """A gold file from a URL, read from the download cache (MissingDownload, an infra error,
    if ``dart tasks fetch`` has not put it there). ``multi``: ``path`` is a list and ``gives``
    picks the files returned (one file if it names one), as in OSWorld."""
    path = params.get("path")
    if not _truthy(params.get("multi")) and not isinstance(path, list):
        return await _cached(ctx, path, "cloud_file")
    if not isinstance(path, list):
        raise ConfigError(f"cloud_file: multi needs a list of URLs, got {path!r}")
    gives = params.get("gives", list(range(len(path))))
    if not isinstance(gives, list) or not all(isinstance(i, int) and 0 <= i < len(path) for i in gives):
        raise ConfigError(f"cloud_file: gives must list indices into path, got {gives!r}")
    picked = [await _cached(ctx, path[i], "cloud_file") for i in gives]
    return picked[0] if len(picked) == 1 else picked


@register_getter("cache_file")
async def cache_file(env: EnvAccess, params: dict[str, Any], ctx: EvalContext) -> FileContent | None:
    """A file from a URL, read from the download cache (OSWorld downloads it at scoring time);
    a plain name is the saved ``stdout`` of an ``execute`` step (in the backend's cache_dir)."""
    path = params.get("path")
    if isinstance(path, str) and not path.startswith(("http://", "https://")):
        folder = ctx.extras.get("cache_dir")
        if folder is None:
            raise ConfigError(f"cache_file {path!r}: this backend keeps no command outputs")
        target = Path(folder) / Path(path).name
        return FileContent(path, target.read_bytes()) if target.is_file() else None
    return await _cached(ctx, path, "cache_file")


@register_getter("list_directory")
async def list_directory(env: EnvAccess, params: dict[str, Any], ctx: EvalContext) -> list[str] | None:
    """The names in a folder (None if it is not there)."""
    path = params.get("path")
    if not isinstance(path, str) or not path:
        raise ConfigError(f"list_directory: path must be a folder path, got {path!r}")
    res = await env.run_command(["ls", "-1A", path], timeout_s=COMMAND_TIMEOUT_S)
    return res.stdout.splitlines() if res.returncode == 0 else None


@register_getter("vm_screen_size")
async def vm_screen_size(env: EnvAccess, params: dict[str, Any], ctx: EvalContext) -> dict[str, int] | None:
    """The screen's {"width", "height"} in pixels (xdotool)."""
    res = await env.run_command(["xdotool", "getdisplaygeometry"], timeout_s=COMMAND_TIMEOUT_S)
    parts = res.stdout.split()
    return {"width": int(parts[0]), "height": int(parts[1])} if res.returncode == 0 and len(parts) == 2 else None


@register_getter("vm_window_size")
async def vm_window_size(env: EnvAccess, params: dict[str, Any], ctx: EvalContext) -> dict[str, int] | None:
    """The {"width", "height"} of the first visible window of class ``app_class_name`` (None if none)."""
    cls = params.get("app_class_name")
    if not isinstance(cls, str) or not cls:
        raise ConfigError(f"vm_window_size: app_class_name must be a window class, got {cls!r}")
    res = await env.run_command(["xdotool", "search", "--onlyvisible", "--class", cls, "getwindowgeometry", "--shell"],
                                timeout_s=COMMAND_TIMEOUT_S)
    values = dict(line.split("=", 1) for line in res.stdout.splitlines() if "=" in line)
    if "WIDTH" not in values or "HEIGHT" not in values:
        return None
    return {"width": int(values["WIDTH"]), "height": int(values["HEIGHT"])}


@register_getter("default_video_player")
async def default_video_player(env: EnvAccess, params: dict[str, Any], ctx: EvalContext) -> str:
    """The desktop file that opens .mp4 videos (xdg-mime)."""
    res = await env.run_command(["xdg-mime", "query", "default", "video/mp4"], timeout_s=COMMAND_TIMEOUT_S)
    return res.stdout.strip()
