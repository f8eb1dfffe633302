"""The ``task_file`` getter: a gold file shipped with the local tasks (OSWorld's ``cloud_file``
without the network). ``{"type": "task_file", "path": "files/notes_gold.txt"}`` reads
``dart/env/xdesktop/tasks/files/notes_gold.txt`` on the machine that scores the task."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dart.env.xdesktop.chrome_getters import register_all as register_browser_getters
from dart.env.xdesktop.setup import TASKS_DIR
from dart.errors import ConfigError, EnvError

GETTER = "task_file"


def task_file_path(path: Any, tasks_dir: Path = TASKS_DIR) -> Path:
    """Where a shipped file lives; ConfigError for paths that leave the tasks folder."""
    if not isinstance(path, str) or not path:
        raise ConfigError(f"{GETTER}: 'path' must be a non-empty string, got {path!r}")
    root = tasks_dir.resolve()
    target = (root / path).resolve()
    if not target.is_relative_to(root):
        raise ConfigError(f"{GETTER}: {path!r} points outside {root}")
    return target


_registered = False


def register() -> None:
    """Register the getter with ``dart.env.evaluators`` (idempotent)."""
    global _registered
    if _registered:
        return
    # Deferred: loads numpy, needed only here.
    from dart.env.evaluators import FileContent, register_getter

    @register_getter(GETTER)
    async def _task_file(env: Any, params: dict[str, Any], ctx: Any) -> FileContent:
        target = task_file_path(params.get("path"))
        try:
            return FileContent(str(target), target.read_bytes())
        except OSError as exc:
            raise EnvError(f"{GETTER}: cannot read the gold file {target}: {exc}") from exc

    # Deferred: loads numpy, needed only here.
    from dart.env.xdesktop.app_getters import register_all as register_app_getters

    register_browser_getters(register_getter)
    register_app_getters(register_getter)
    _registered = True
