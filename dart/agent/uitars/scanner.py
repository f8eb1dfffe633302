"""A small scanner for UI-TARS call syntax (``name(arg, key='value', ...)``).

Model text is only ever *read* here: no ``eval``, no ``ast.literal_eval``. Strings may hold
unescaped apostrophes as real model output does (``content='I've done it'``): a quote closes a
string only where what follows looks like the next argument or the end of the call.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from dart.agent.actions import InvalidAction


class _SyntaxError(Exception):
    """Internal: the scanner could not read a call; becomes an InvalidAction."""


CALL_START = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)\s*\(")
_KWARG_START = re.compile(r"\s*([A-Za-z_][A-Za-z0-9_]*)\s*=(?!=)")
# After a candidate closing quote: another keyword argument, or the end of the call followed
# by the end of the line / text or the next call. This is what lets content keep its
# unescaped apostrophes ("I've") as the real model writes them.
_STRING_END = re.compile(
    r"\s*(?:,\s*[A-Za-z_][A-Za-z0-9_]*\s*=|,?\s*\)[ \t]*(?:$|\r?\n|[A-Za-z_][A-Za-z0-9_]*\s*\())"
)
_ESCAPES = {"n": "\n", "t": "\t", "\\": "\\", "'": "'", '"': '"'}
_BLANK_LINE = re.compile(r"\n[ \t]*\n")


@dataclass(frozen=True, slots=True)
class Call:
    name: str
    args: tuple[str, ...]
    kwargs: dict[str, str]
    text: str


def _read_string(src: str, pos: int) -> tuple[str, int]:
    """Read a quoted string starting at ``src[pos]``; returns (value, index after the quote)."""
    quote = src[pos]
    i = pos + 1
    first_close = -1
    while i < len(src):
        ch = src[i]
        if ch == "\\" and i + 1 < len(src):
            i += 2
            continue
        if ch == quote:
            if first_close < 0:
                first_close = i
            if _STRING_END.match(src, i + 1):
                return _unescape(src[pos + 1 : i]), i + 1
        i += 1
    if first_close >= 0:
        return _unescape(src[pos + 1 : first_close]), first_close + 1
    raise _SyntaxError(f"unterminated string starting at column {pos}")


def _unescape(raw: str) -> str:
    out: list[str] = []
    i = 0
    while i < len(raw):
        ch = raw[i]
        if ch == "\\" and i + 1 < len(raw) and raw[i + 1] in _ESCAPES:
            out.append(_ESCAPES[raw[i + 1]])
            i += 2
        else:
            out.append(ch)
            i += 1
    return "".join(out)


def _read_bare(src: str, pos: int) -> tuple[str, int]:
    """An unquoted value (``(100,200)``, ``5``) up to the next top-level ``,`` or ``)``."""
    depth = 0
    i = pos
    while i < len(src):
        ch = src[i]
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            if depth == 0:
                break
            depth -= 1
        elif ch == "," and depth == 0:
            break
        elif ch == "\n" and depth == 0:
            raise _SyntaxError("line break inside an unquoted argument")
        i += 1
    value = src[pos:i].strip()
    if not value:
        raise _SyntaxError(f"empty argument at column {pos}")
    return value, i


def _skip_ws(src: str, pos: int) -> int:
    while pos < len(src) and src[pos].isspace():
        pos += 1
    return pos


def _read_call(src: str, pos: int) -> tuple[Call, int]:
    """Read ``name(arg, kw=value, ...)`` starting at ``pos``."""
    m = CALL_START.match(src, pos)
    if m is None:
        raise _SyntaxError("expected an action call like click(start_box='(x,y)')")
    name = m.group(1)
    i = m.end()
    args: list[str] = []
    kwargs: dict[str, str] = {}
    while True:
        i = _skip_ws(src, i)
        if i >= len(src):
            raise _SyntaxError(f"{name}(: missing ')'")
        if src[i] == ")":
            return Call(name, tuple(args), kwargs, src[pos : i + 1]), i + 1
        key = None
        km = _KWARG_START.match(src, i)
        if km is not None:
            key = km.group(1)
            i = _skip_ws(src, km.end())
        elif kwargs:
            raise _SyntaxError(f"{name}: positional argument after keyword argument")
        if i >= len(src):
            raise _SyntaxError(f"{name}(: missing ')'")
        value, i = _read_string(src, i) if src[i] in "'\"" else _read_bare(src, i)
        if key is None:
            args.append(value)
        elif key in kwargs:
            raise _SyntaxError(f"{name}: argument {key!r} given twice")
        else:
            kwargs[key] = value
        i = _skip_ws(src, i)
        if i >= len(src):
            raise _SyntaxError(f"{name}(: missing ')'")
        if src[i] == ",":
            i += 1
        elif src[i] != ")":
            raise _SyntaxError(f"{name}: expected ',' or ')' at column {i}")


def _resync(src: str, pos: int) -> int:
    """Where scanning resumes after unreadable text: the next blank line, else the end."""
    m = _BLANK_LINE.search(src, pos)
    return m.end() if m else len(src)


def read_calls(src: str) -> list[Call | InvalidAction]:
    out: list[Call | InvalidAction] = []
    pos = _skip_ws(src, 0)
    while pos < len(src):
        try:
            call, pos = _read_call(src, pos)
            out.append(call)
        except _SyntaxError as exc:
            end = _resync(src, pos)
            out.append(InvalidAction(reason=str(exc), text=src[pos:end].strip()))
            pos = end
        pos = _skip_ws(src, pos)
    return out
