"""Typed actions as xdotool commands (pure), and a runner for them.

``xdotool_argvs(action, screen=(w, h))`` is a pure function from a typed action to the argv
lists that perform it on an X display; the local X desktop and a VM's guest agent both run
them. Key names are UI-TARS's ('ctrl', 'enter', 'esc', 'pagedown', 'a', 'f5') mapped to X
keysyms. Model text only ever becomes argv elements after ``--`` (never a shell, never an
option), and an unknown key name is :class:`UnknownKey` (the step does nothing), not a crash.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Mapping, Sequence
from typing import Any

from dart.agent.actions import Action, Click, Drag, Hotkey, LeftDouble, RightSingle, Scroll, Type
from dart.errors import EnvError

Argv = list[str]

KEYSYMS: dict[str, str] = {
    "ctrl": "ctrl", "control": "ctrl", "lctrl": "ctrl", "rctrl": "ctrl",
    "alt": "alt", "option": "alt", "shift": "shift",
    "win": "super", "super": "super", "cmd": "super", "command": "super", "meta": "super",
    "enter": "Return", "return": "Return", "esc": "Escape", "escape": "Escape",
    "tab": "Tab", "space": "space", "backspace": "BackSpace", "delete": "Delete", "del": "Delete",
    "insert": "Insert", "home": "Home", "end": "End",
    "pageup": "Prior", "page_up": "Prior", "pgup": "Prior",
    "pagedown": "Next", "page_down": "Next", "pgdn": "Next",
    "up": "Up", "down": "Down", "left": "Left", "right": "Right",
    "arrowup": "Up", "arrowdown": "Down", "arrowleft": "Left", "arrowright": "Right",
    "capslock": "Caps_Lock", "numlock": "Num_Lock", "printscreen": "Print", "prtsc": "Print",
    "menu": "Menu", "pause": "Pause",
    "+": "plus", "-": "minus", "=": "equal", ",": "comma", ".": "period", "/": "slash",
    "\\": "backslash", ";": "semicolon", "'": "apostrophe", "`": "grave", "[": "bracketleft",
    "]": "bracketright",
}
_FKEY = re.compile(r"^f([1-9]|1[0-9]|2[0-4])$")
SCROLL_BUTTONS = {"up": "4", "down": "5", "left": "6", "right": "7"}


class UnknownKey(ValueError):
    """A key name that maps to no X keysym: the action does nothing (it is not an env failure)."""


def keysym(name: str) -> str:
    """The X keysym of a UI-TARS key name."""
    key = name.strip()
    low = key.lower()
    if low in KEYSYMS:
        return KEYSYMS[low]
    if _FKEY.match(low):
        return low.upper()
    if len(key) == 1 and key.isalnum() and key.isascii():
        return low
    raise UnknownKey(f"unknown key {name!r}")


def key_combo(keys: Sequence[str]) -> str:
    """'ctrl+shift+s' from ('ctrl', 'shift', 's'); UI-TARS also writes 'ctrl+s' as one name."""
    names = [part for k in keys for part in (k.split("+") if len(k) > 1 else [k]) if part]
    if not names:
        raise UnknownKey("hotkey without keys")
    return "+".join(keysym(n) for n in names)


def _point(x: float | None, y: float | None, screen: tuple[int, int]) -> tuple[str, str]:
    if x is None or y is None:
        raise UnknownKey("an action without a point")
    w, h = screen
    return str(min(max(round(x), 0), w - 1)), str(min(max(round(y), 0), h - 1))


def xdotool_argvs(
    action: Action, *, screen: tuple[int, int], type_delay_ms: int = 5, scroll_clicks: int = 5
) -> list[Argv]:
    """The xdotool command lines that perform ``action`` (empty: nothing to do).

    Points are clamped to the screen. ``type_delay_ms``: LibreOffice drops repeated keys typed
    with no delay (measured: '1200' became '120' at 0 ms; exact from 3 ms).
    """
    match action:
        case Click():
            return [["xdotool", "mousemove", "--sync", *_point(action.x, action.y, screen), "click", "1"]]
        case LeftDouble():
            return [["xdotool", "mousemove", "--sync", *_point(action.x, action.y, screen),
                     "click", "--repeat", "2", "--delay", "60", "1"]]
        case RightSingle():
            return [["xdotool", "mousemove", "--sync", *_point(action.x, action.y, screen), "click", "3"]]
        case Drag():
            x0, y0 = _point(action.x, action.y, screen)
            x1, y1 = _point(action.end_x, action.end_y, screen)
            mx, my = str((int(x0) + int(x1)) // 2), str((int(y0) + int(y1)) // 2)
            # A move in between: some toolkits start a drag only after motion with the button down.
            return [["xdotool", "mousemove", "--sync", x0, y0, "mousedown", "1", "mousemove", "--sync", mx, my,
                     "mousemove", "--sync", x1, y1, "mouseup", "1"]]
        case Hotkey():
            return [["xdotool", "key", "--clearmodifiers", key_combo(action.keys)]]
        case Type():
            return _type_argvs(action.content, type_delay_ms)
        case Scroll():
            move = (
                ["mousemove", "--sync", *_point(action.x, action.y, screen)]
                if action.x is not None and action.y is not None
                else []
            )
            button = SCROLL_BUTTONS[action.direction]
            return [["xdotool", *move, "click", "--repeat", str(scroll_clicks), "--delay", "10", button]]
    return []  # wait, finished, call_user, invalid: no input


def _type_argvs(content: str, delay_ms: int) -> list[Argv]:
    # xdotool types '\n' as nothing on Xvfb: press Return between the lines ourselves.
    out: list[Argv] = []
    lines = content.split("\n")
    for i, line in enumerate(lines):
        if line:
            out.append(["xdotool", "type", "--clearmodifiers", "--delay", str(delay_ms), "--", line])
        if i < len(lines) - 1:
            out.append(["xdotool", "key", "--clearmodifiers", "Return"])
    return out


async def run_argvs(argvs: Sequence[Argv], *, env: Mapping[str, str], timeout_s: float = 20.0,
                    spawn: Mapping[str, Any] | None = None) -> None:
    """Run xdotool command lines in order on the display named by ``env['DISPLAY']``.

    EnvError if one fails or hangs: the display is gone or wedged (an infra error).
    """
    for argv in argvs:
        proc = await asyncio.create_subprocess_exec(
            *argv, env=dict(env), stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE, **(spawn or {})
        )
        try:
            _, err = await asyncio.wait_for(proc.communicate(), timeout_s)
        except TimeoutError as exc:
            proc.kill()
            await proc.wait()
            raise EnvError(f"{argv[0]} {argv[1]} hung for {timeout_s} s on display {env.get('DISPLAY')}") from exc
        if proc.returncode != 0:
            raise EnvError(
                f"{' '.join(argv[:2])} failed on display {env.get('DISPLAY')} (exit {proc.returncode}): "
                f"{err.decode(errors='replace').strip()[:300]}"
            )
