"""UI-TARS model text <-> typed actions, in screen pixels.

Parsing is a small hand-written scanner over the call syntax (``click(start_box='(x,y)')``):
model text is never evaluated (no ``eval``, no ``ast.literal_eval``), and anything the scanner
cannot read becomes an :class:`InvalidAction` carrying the reason, never an exception.

Two coordinate conventions, chosen by the caller:

- ``qwen25vl`` (UI-TARS-1.5 / Qwen2.5-VL): absolute pixels of the *smart-resized* image,
  ``x_screen = x * W / resized_W``;
- ``qwen2vl`` (UI-TARS 1.0 / Qwen2-VL): relative 0..1000, ``x_screen = x * W / 1000``.

Rendering goes the other way and rounds to integer model coordinates, so ``parse(render(a))``
equals ``a`` exactly for screen points on the model grid and within one screen pixel otherwise.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass

from dart.agent.actions import (
    SCROLL_DIRECTIONS,
    Action,
    CallUser,
    Click,
    Drag,
    Finished,
    Hotkey,
    InvalidAction,
    LeftDouble,
    RightSingle,
    Scroll,
    Type,
    Wait,
)
from dart.agent.uitars.coords import (
    CONVENTIONS,
    FACTOR,
    MAX_PIXELS,
    MIN_PIXELS,
    RELATIVE_SCALE,
    Convention,
    Frame,
    parse_point,
    smart_resize,
)
from dart.agent.uitars.scanner import CALL_START, Call, read_calls

__all__ = [
    "CONVENTIONS",
    "FACTOR",
    "MAX_PIXELS",
    "MIN_PIXELS",
    "RELATIVE_SCALE",
    "Convention",
    "Frame",
    "ParsedResponse",
    "action_of_call",
    "parse_actions",
    "parse_point",
    "parse_response",
    "render_action",
    "render_response",
    "smart_resize",
]

log = logging.getLogger(__name__)


# ---------------------------------------------------------------------------------------------
# Calls -> typed actions

_POINT_KEYS = ("start_box", "point", "start_point", "box", "start")
_END_KEYS = ("end_box", "end_point", "end")
_KEY_KEYS = ("key", "hotkey", "keys")
_ALIASES = {
    "left_single": "click",
    "double_click": "left_double",
    "right_click": "right_single",
    "select": "drag",
    "press": "hotkey",
    "finish": "finished",
    "type_text": "type",
}
_KNOWN = (
    "click",
    "left_double",
    "right_single",
    "drag",
    "hotkey",
    "type",
    "scroll",
    "wait",
    "finished",
    "call_user",
)


def _arg(call: Call, keys: tuple[str, ...], *, position: int | None = 0, required: bool = True) -> str | None:
    for k in keys:
        if k in call.kwargs:
            return call.kwargs[k]
    if position is not None and position < len(call.args):
        return call.args[position]
    if required:
        raise ValueError(f"{call.name} needs {keys[0]}=")
    return None


def _split_keys(spec: str) -> tuple[str, ...]:
    keys = spec.split()
    if len(keys) == 1 and "+" in keys[0] and keys[0] != "+":
        keys = [k for k in keys[0].split("+") if k]
    return tuple(keys)


def action_of_call(call: Call, frame: Frame) -> Action:
    """The typed action one scanned call stands for; InvalidAction if it cannot be one."""
    name = _ALIASES.get(call.name, call.name)
    try:
        match name:
            case "click" | "left_double" | "right_single":
                x, y = parse_point(_arg(call, _POINT_KEYS) or "", frame)
                cls = {"click": Click, "left_double": LeftDouble, "right_single": RightSingle}[name]
                return cls(x=x, y=y)
            case "drag":
                x, y = parse_point(_arg(call, _POINT_KEYS) or "", frame)
                ex, ey = parse_point(_arg(call, _END_KEYS, position=1) or "", frame)
                return Drag(x=x, y=y, end_x=ex, end_y=ey)
            case "hotkey":
                keys = _split_keys(_arg(call, _KEY_KEYS) or "")
                if not keys:
                    raise ValueError("hotkey without keys")
                return Hotkey(keys=keys)
            case "type":
                return Type(content=_arg(call, ("content", "text")) or "")
            case "scroll":
                direction = (_arg(call, ("direction",), position=None) or "").strip().lower()
                if direction not in SCROLL_DIRECTIONS:
                    raise ValueError(
                        f"scroll direction must be one of {SCROLL_DIRECTIONS}, got {direction!r}"
                    )
                where = _arg(call, _POINT_KEYS, required=False)
                if where is None:
                    return Scroll(direction=direction)  # type: ignore[arg-type]
                x, y = parse_point(where, frame)
                return Scroll(x=x, y=y, direction=direction)  # type: ignore[arg-type]
            case "wait":
                return Wait()
            case "finished":
                return Finished(content=_arg(call, ("content",), required=False) or "")
            case "call_user":
                return CallUser()
    except ValueError as exc:
        return InvalidAction(reason=str(exc), text=call.text)
    return InvalidAction(reason=f"unknown action {call.name!r}; known: {', '.join(_KNOWN)}", text=call.text)


# ---------------------------------------------------------------------------------------------
# Whole responses

_HEADER = re.compile(r"^[ \t]*(Thought|Reflection|Action_Summary|Action)[ \t]*[:：][ \t]*", re.MULTILINE)
_ACTION_HEADER = re.compile(r"^[ \t]*Action[ \t]*[:：][ \t]*", re.MULTILINE)
_THINK = re.compile(r"<think>.*?</think>", re.DOTALL)
_SPECIAL_TOKENS = re.compile(r"<\|im_end\|>|<\|endoftext\|>|<\|im_start\|>")


@dataclass(frozen=True, kw_only=True, slots=True)
class ParsedResponse:
    thought: str | None
    reflection: str | None
    summary: str | None
    """The ``Action_Summary:`` section, if any."""
    actions: list[Action]
    """At least one action; unreadable text is an InvalidAction."""


def _parse_response(text: str, frame: Frame) -> ParsedResponse:
    """The parser proper; raises nothing for any ``str`` (a hypothesis test holds it to that)."""
    if not isinstance(text, str):
        return ParsedResponse(
            thought=None,
            reflection=None,
            summary=None,
            actions=[InvalidAction(reason=f"model output is {type(text).__name__}, not text")],
        )
    body = _SPECIAL_TOKENS.sub("", _THINK.sub("", text))
    sections: dict[str, str] = {}
    heads = list(_HEADER.finditer(body))
    # The first "Action:" header starts the actions. A model that repeats the header for each
    # action gets every one of them read (the repeats become separators), none silently dropped.
    action_at = next((i for i, m in enumerate(heads) if m.group(1) == "Action"), None)
    for i, m in enumerate(heads[: action_at if action_at is not None else len(heads)]):
        end = heads[i + 1].start() if i + 1 < len(heads) else len(body)
        sections.setdefault(m.group(1), body[m.end() : end].strip())
    if action_at is not None:
        action_text = _ACTION_HEADER.sub("\n\n", body[heads[action_at].end() :])
    elif CALL_START.match(body.strip()) and not heads:
        action_text = body  # a bare call with no headers at all
    else:
        action_text = ""
    actions: list[Action] = []
    for item in read_calls(action_text):
        actions.append(item if isinstance(item, InvalidAction) else action_of_call(item, frame))
    if not actions:
        reason = "no 'Action:' in the response" if action_at is None else "empty 'Action:'"
        actions = [InvalidAction(reason=reason, text=text[-500:])]
    return ParsedResponse(
        thought=sections.get("Thought"),
        reflection=sections.get("Reflection"),
        summary=sections.get("Action_Summary"),
        actions=actions,
    )


def parse_response(
    text: str,
    *,
    screen: tuple[int, int],
    convention: Convention = "qwen25vl",
    factor: int = FACTOR,
    min_pixels: int = MIN_PIXELS,
    max_pixels: int = MAX_PIXELS,
) -> ParsedResponse:
    """Thought / Reflection / Action_Summary and the actions of one model answer.

    ``screen`` is (width, height). Raises ConfigError only for a bad ``screen`` or
    ``convention`` (the caller's fault); any text parses, unreadable parts into InvalidAction.
    """
    frame = Frame.of(screen, convention, factor=factor, min_pixels=min_pixels, max_pixels=max_pixels)
    try:
        return _parse_response(text, frame)
    except Exception as exc:  # a parser bug must not take a service down with it
        log.exception("UI-TARS parser failed on %r", text[:200] if isinstance(text, str) else text)
        return ParsedResponse(
            thought=None,
            reflection=None,
            summary=None,
            actions=[InvalidAction(reason=f"parser error: {exc!r}", text=str(text)[:500])],
        )


def parse_actions(
    text: str,
    *,
    screen: tuple[int, int],
    convention: Convention = "qwen25vl",
    factor: int = FACTOR,
    min_pixels: int = MIN_PIXELS,
    max_pixels: int = MAX_PIXELS,
) -> list[Action]:
    """The actions of one model answer, in screen pixels (see :func:`parse_response`)."""
    return parse_response(
        text,
        screen=screen,
        convention=convention,
        factor=factor,
        min_pixels=min_pixels,
        max_pixels=max_pixels,
    ).actions


# ---------------------------------------------------------------------------------------------
# Rendering (actions -> model text), the inverse of parsing


def _quote(s: str) -> str:
    return "'" + s.replace("\\", "\\\\").replace("'", "\\'").replace("\n", "\\n") + "'"


def _box(frame: Frame, x: float, y: float) -> str:
    mx, my = frame.to_model(x, y)
    return _quote(f"({mx},{my})")


def _render(action: Action, frame: Frame) -> str:
    match action:
        case Click() | LeftDouble() | RightSingle():
            return f"{action.kind}(start_box={_box(frame, action.x, action.y)})"
        case Drag():
            return f"drag(start_box={_box(frame, action.x, action.y)}, end_box={_box(frame, action.end_x, action.end_y)})"
        case Hotkey():
            return f"hotkey(key={_quote(' '.join(action.keys))})"
        case Type():
            return f"type(content={_quote(action.content)})"
        case Scroll():
            if action.x is None or action.y is None:
                return f"scroll(direction={_quote(action.direction)})"
            return (
                f"scroll(start_box={_box(frame, action.x, action.y)}, direction={_quote(action.direction)})"
            )
        case Wait():
            return "wait()"
        case Finished():
            return f"finished(content={_quote(action.content)})"
        case CallUser():
            return "call_user()"
        case InvalidAction():
            return action.text
    raise TypeError(f"not an action: {action!r}")


def render_action(action: Action, *, screen: tuple[int, int], convention: Convention = "qwen25vl") -> str:
    """The UI-TARS call text of one action, coordinates rounded to integer model units."""
    return _render(action, Frame.of(screen, convention))


def render_response(
    thought: str | None,
    actions: list[Action],
    *,
    screen: tuple[int, int],
    convention: Convention = "qwen25vl",
) -> str:
    """A whole model answer: ``Thought: ...`` (if any), then ``Action:`` and the actions
    separated by blank lines."""
    frame = Frame.of(screen, convention)
    calls = "\n\n".join(_render(a, frame) for a in actions)
    head = f"Thought: {thought}\n" if thought is not None else ""
    return f"{head}Action: {calls}"
