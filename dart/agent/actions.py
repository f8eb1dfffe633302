"""Typed GUI actions: what a policy may ask an environment to do.

Points are screen pixels of the environment (not of the resized model image). Model text is
parsed into these (``dart.agent.uitars``); only an env backend turns them into input events.
Every action converts to and from the wire form :class:`dart.events.ParsedAction`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from dart.events import ParsedAction

ScrollDirection = Literal["up", "down", "left", "right"]
SCROLL_DIRECTIONS: tuple[str, ...] = ("up", "down", "left", "right")


@dataclass(frozen=True, kw_only=True, slots=True)
class Click:
    kind: Literal["click"] = "click"
    x: float
    y: float


@dataclass(frozen=True, kw_only=True, slots=True)
class LeftDouble:
    kind: Literal["left_double"] = "left_double"
    x: float
    y: float


@dataclass(frozen=True, kw_only=True, slots=True)
class RightSingle:
    kind: Literal["right_single"] = "right_single"
    x: float
    y: float


@dataclass(frozen=True, kw_only=True, slots=True)
class Drag:
    kind: Literal["drag"] = "drag"
    x: float
    y: float
    end_x: float
    end_y: float


@dataclass(frozen=True, kw_only=True, slots=True)
class Hotkey:
    kind: Literal["hotkey"] = "hotkey"
    keys: tuple[str, ...]
    """Key names in press order, lower case as UI-TARS writes them ('ctrl', 'c')."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Type:
    kind: Literal["type"] = "type"
    content: str
    """Text to type; a trailing newline means press Enter after typing."""

    @property
    def submit(self) -> bool:
        return self.content.endswith("\n")


@dataclass(frozen=True, kw_only=True, slots=True)
class Scroll:
    kind: Literal["scroll"] = "scroll"
    x: float | None = None
    y: float | None = None
    direction: ScrollDirection


@dataclass(frozen=True, kw_only=True, slots=True)
class Wait:
    kind: Literal["wait"] = "wait"


@dataclass(frozen=True, kw_only=True, slots=True)
class Finished:
    kind: Literal["finished"] = "finished"
    content: str = ""


@dataclass(frozen=True, kw_only=True, slots=True)
class CallUser:
    """The agent gives up or declares the task infeasible (OSWorld's FAIL)."""

    kind: Literal["call_user"] = "call_user"


@dataclass(frozen=True, kw_only=True, slots=True)
class InvalidAction:
    """Model text that could not be parsed; a step that does nothing, never a crash."""

    kind: Literal["invalid"] = "invalid"
    reason: str
    text: str = ""


Action = (
    Click | LeftDouble | RightSingle | Drag | Hotkey | Type | Scroll | Wait | Finished | CallUser | InvalidAction
)
TERMINAL_KINDS = frozenset({"finished", "call_user"})


def to_wire(action: Action) -> ParsedAction:
    """The event form of an action."""
    match action:
        case Click() | LeftDouble() | RightSingle():
            return ParsedAction(kind=action.kind, x=action.x, y=action.y)
        case Drag():
            return ParsedAction(kind="drag", x=action.x, y=action.y, end_x=action.end_x, end_y=action.end_y)
        case Hotkey():
            return ParsedAction(kind="hotkey", text=" ".join(action.keys))
        case Type():
            return ParsedAction(kind="type", text=action.content)
        case Scroll():
            return ParsedAction(kind="scroll", x=action.x, y=action.y, direction=action.direction)
        case Wait() | CallUser():
            return ParsedAction(kind=action.kind)
        case Finished():
            return ParsedAction(kind="finished", text=action.content)
        case InvalidAction():
            return ParsedAction(kind="invalid", text=action.reason)
    raise TypeError(f"not an action: {action!r}")


def from_wire(p: ParsedAction) -> Action:
    """The typed action of an event's ParsedAction; a malformed one becomes InvalidAction."""
    try:
        match p.kind:
            case "click":
                return Click(x=_num(p.x), y=_num(p.y))
            case "left_double":
                return LeftDouble(x=_num(p.x), y=_num(p.y))
            case "right_single":
                return RightSingle(x=_num(p.x), y=_num(p.y))
            case "drag":
                return Drag(x=_num(p.x), y=_num(p.y), end_x=_num(p.end_x), end_y=_num(p.end_y))
            case "hotkey":
                keys = tuple((p.text or "").split())
                if not keys:
                    raise ValueError("hotkey without keys")
                return Hotkey(keys=keys)
            case "type":
                return Type(content=p.text or "")
            case "scroll":
                if p.direction not in SCROLL_DIRECTIONS:
                    raise ValueError(f"scroll direction {p.direction!r}")
                return Scroll(x=p.x, y=p.y, direction=p.direction)  # type: ignore[arg-type]
            case "wait":
                return Wait()
            case "finished":
                return Finished(content=p.text or "")
            case "call_user":
                return CallUser()
            case "invalid":
                return InvalidAction(reason=p.text or "invalid")
    except ValueError as exc:
        return InvalidAction(reason=f"malformed {p.kind}: {exc}")
    return InvalidAction(reason=f"unknown action kind {p.kind!r}")


def _num(v: float | None) -> float:
    if v is None:
        raise ValueError("missing coordinate")
    return float(v)
