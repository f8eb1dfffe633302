"""Scripted solutions of the local xdesktop tasks (keyboard only, so they hold at any screen
size, but for a click in GIMP and one in the browser, made at 1024x768) and the loader of those tasks."""

from __future__ import annotations

import json

from dart.agent.actions import Action, Click, Hotkey, Type, Wait
from dart.env.tasks import Task
from dart.env.xdesktop.setup import TASKS_DIR
from dart.errors import ConfigError


def _keys(*names: str) -> Hotkey:
    return Hotkey(keys=names)


_SAVE_XLSX = [_keys("ctrl", "s"), Wait()]  # the slot's profile does not ask "Keep current format?"

PLANS: dict[str, tuple[Action, ...]] = {
    "xdesktop-mousepad-hello": (_keys("ctrl", "a"), Type(content="Hello, dart!"), _keys("ctrl", "s")),
    "xdesktop-mousepad-append": (_keys("ctrl", "end"), Type(content="call mom\n"), _keys("ctrl", "s")),
    "xdesktop-mousepad-typo": (
        _keys("ctrl", "home"), _keys("ctrl", "right"), _keys("ctrl", "right"), _keys("left"),
        Type(content="c"), _keys("ctrl", "s"),
    ),
    "xdesktop-mousepad-delete-line": (
        _keys("ctrl", "home"), _keys("down"), _keys("shift", "down"), _keys("delete"), _keys("ctrl", "s"),
    ),
    "xdesktop-calc-fill-budget": (
        _keys("ctrl", "home"), _keys("right"), _keys("down"), Type(content="1200\n300\n"), *_SAVE_XLSX,
    ),
    "xdesktop-calc-sum-formula": (
        _keys("ctrl", "home"), _keys("ctrl", "down"), _keys("down"), Type(content="=SUM(A2:A4)\n"), *_SAVE_XLSX,
    ),
    "xdesktop-calc-ods-header": (_keys("ctrl", "home"), Type(content="Region\n"), _keys("ctrl", "s"), Wait()),
    "xdesktop-writer-minutes-title": (_keys("ctrl", "home"), Type(content="Minutes of 3 May\n"), _keys("ctrl", "s"),
                                      Wait()),
    # Impress: Tab selects the title box, Enter edits its text.
    "xdesktop-impress-retitle": (Wait(), _keys("tab"), _keys("enter"), _keys("ctrl", "a"),
                                 Type(content="Quarterly review"), _keys("escape"), _keys("ctrl", "s"), Wait()),
    # GIMP: the Flip tool (Shift+F) clicked on the picture, then Export (Ctrl+E), Replace, and PNG's Export.
    # NOTE: a click, as in the browser plan below: the picture sits at (505, 421) on a 1024x768 screen only.
    "xdesktop-gimp-flip": (Wait(), _keys("shift", "f"), Click(x=505, y=421), Wait(), _keys("ctrl", "e"), Wait(),
                           _keys("enter"), Wait(), _keys("enter"), Wait(), Wait(), _keys("enter"), Wait(), Wait()),
    # Browser -> clipboard -> spreadsheet: Calc takes the text unformatted (Ctrl+Alt+Shift+V).
    # A click on the page first: Chromium may open the tab with the focus in its address bar, and
    # Ctrl+A there copies the URL (a CI run pasted it into B2). The page is blank at (512, 450) on
    # a 1024x768 screen.
    "xdesktop-chrome-to-calc-invoice": (
        Wait(), Click(x=512, y=450), _keys("ctrl", "a"), _keys("ctrl", "c"), _keys("alt", "tab"), Wait(), _keys("ctrl", "home"),
        _keys("right"), _keys("down"), _keys("ctrl", "alt", "shift", "v"), Wait(), _keys("enter"), *_SAVE_XLSX,
    ),
}


def oracle_plan(task_id: str) -> list[Action]:
    """The scripted actions that solve local task ``task_id`` from its start state."""
    try:
        return list(PLANS[task_id])
    except KeyError:
        raise ConfigError(f"no scripted plan for task {task_id!r} (known: {', '.join(sorted(PLANS))})") from None


def local_tasks() -> list[Task]:
    """The tasks shipped in ``dart/env/xdesktop/tasks/*.json`` (domain 'xdesktop'), by id."""
    tasks = []
    for path in sorted(TASKS_DIR.glob("*.json")):
        try:
            tasks.append(Task.from_dict(json.loads(path.read_text(encoding="utf-8")), domain="xdesktop"))
        except (OSError, ValueError) as exc:
            raise ConfigError(f"cannot read local task {path}: {exc}") from exc
    return sorted(tasks, key=lambda t: t.id)
