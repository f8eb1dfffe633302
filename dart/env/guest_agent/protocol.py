"""The guest-agent wire protocol, as pure functions: request bodies in, typed requests out.

The endpoints follow the OSWorld in-VM server (port 5000) so the same client talks to a stock
OSWorld image and to ``dart guest-agent``:

=========================  ============================================================
``GET /screenshot``         PNG of the whole X screen
``GET|POST /screen_size``   ``{"width": W, "height": H}``
``GET /platform``           ``Linux``
``GET /cursor_position``    ``[x, y]``
``POST /execute``           ``{"command": [argv...] | "string", "shell": false}`` ->
                            ``{"status", "output", "error", "returncode"}``
``POST /setup/execute``     same as ``/execute``
``POST /setup/launch``      start a program in the background (same body)
``POST /file``              form or JSON ``file_path`` -> the file's bytes (404 if missing)
``POST /setup/upload``      multipart ``file_path`` + ``file_data`` -> writes the file
``POST /setup/open_file``   ``{"path": P}`` -> ``xdg-open P``
``POST /setup/activate_window`` ``{"window_name", "strict", "by_class"}``
``POST /action``            dart only: a typed action (the ``ParsedAction`` fields)
``GET /health``             dart only: ``{"ok": true, "display": ":N", ...}``
=========================  ============================================================

Every endpoint but ``/health`` needs the VM's token in the ``X-Dart-Agent-Token`` header
(:func:`check_token`); the env worker makes one per VM and hands it over through the domain
(see ``TOKEN_FILE``). A request without it is a 401 and changes nothing.

OSWorld's server evaluates pyautogui code strings; ours never evaluates anything. Actions
arrive typed and become input events; ``/execute`` runs an argv list without a shell
(a string is split with :func:`shlex.split`) and exists for task setup steps and getters.
"""

from __future__ import annotations

import hmac
import math
import re
import shlex
from dataclasses import dataclass
from typing import Any

from dart.agent.actions import Action, from_wire
from dart.errors import DartError
from dart.events import ParsedAction

DEFAULT_PORT = 5000
DEFAULT_HOST = "127.0.0.1"
DEFAULT_EXEC_TIMEOUT_S = 120.0
MAX_EXEC_TIMEOUT_S = 3600.0

TOKEN_HEADER = "X-Dart-Agent-Token"
TOKEN_FILE = "/sys/firmware/qemu_fw_cfg/by_name/opt/dart/agent_token/raw"
"""Where a guest finds its token by default: the domain template puts the pool's per-VM token
into QEMU's firmware config (``<sysinfo type='fwcfg'>``), which the guest kernel exposes here."""
OPEN_PATHS = frozenset({"/health"})
"""Answered without the token (liveness only: it reveals the display size and uptime)."""
MIN_TOKEN_CHARS = 16

_ACTION_FIELDS = {"kind": str, "x": float, "y": float, "end_x": float, "end_y": float, "text": str, "direction": str}


class ProtocolError(DartError, ValueError):
    """A request body the agent cannot accept; answered with HTTP 400 and this message."""


class Unauthorized(ProtocolError):
    """A request without the VM's token (or with a wrong one); answered with HTTP 401."""


def check_token(expected: str, presented: str | None) -> None:
    """Pass only when ``presented`` is exactly ``expected`` (compared in constant time, so the
    answer time says nothing about how much of a guess was right)."""
    if presented is None:
        raise Unauthorized(f"missing {TOKEN_HEADER} header (the env worker sends the VM's token)")
    if not hmac.compare_digest(presented.encode("utf-8", "surrogateescape"), expected.encode()):
        raise Unauthorized(f"wrong {TOKEN_HEADER}")


def parse_token(text: str) -> str:
    """A token as read from a file or the environment: one line, at least MIN_TOKEN_CHARS."""
    token = text.strip()
    if len(token) < MIN_TOKEN_CHARS or any(c.isspace() or not c.isprintable() for c in token):
        raise ProtocolError(f"an agent token is one line of at least {MIN_TOKEN_CHARS} printable characters "
                            f"without spaces (got {len(token)} characters)")
    return token


@dataclass(frozen=True, kw_only=True, slots=True)
class ExecRequest:
    argv: tuple[str, ...]
    timeout_s: float = DEFAULT_EXEC_TIMEOUT_S


@dataclass(frozen=True, kw_only=True, slots=True)
class WindowRequest:
    window_name: str
    strict: bool = False
    by_class: bool = False


def parse_exec(body: Any, *, allow_shell: bool = False) -> ExecRequest:
    """An ``/execute`` or ``/setup/launch`` body as an argv list.

    ``shell: true`` is refused unless the agent was started with ``--allow-shell`` (then the
    string runs under ``sh -c``): setup steps are argv lists, and nothing the agent receives
    is ever handed to a shell by default.
    """
    if not isinstance(body, dict):
        raise ProtocolError(f"expected a JSON object with 'command', got {type(body).__name__}")
    command = body.get("command")
    shell = body.get("shell", False)
    if not isinstance(shell, bool):
        raise ProtocolError(f"'shell' must be true or false, got {shell!r}")
    timeout_s = _timeout(body.get("timeout", DEFAULT_EXEC_TIMEOUT_S))
    if isinstance(command, str):
        if shell:
            if not allow_shell:
                raise ProtocolError(
                    "shell commands are disabled; send an argv list, or start the agent with --allow-shell"
                )
            return ExecRequest(argv=("sh", "-c", command), timeout_s=timeout_s)
        try:
            argv = shlex.split(command)
        except ValueError as exc:
            raise ProtocolError(f"cannot split command {command!r}: {exc}") from exc
    elif isinstance(command, list) and all(isinstance(a, str) for a in command):
        if shell:
            if not allow_shell:
                raise ProtocolError(
                    "shell commands are disabled; send shell=false, or start the agent with --allow-shell"
                )
            return ExecRequest(argv=("sh", "-c", shlex.join(command)), timeout_s=timeout_s)
        argv = list(command)
    else:
        raise ProtocolError(f"'command' must be a list of strings or a string, got {command!r}")
    if not argv:
        raise ProtocolError("'command' is empty")
    return ExecRequest(argv=tuple(argv), timeout_s=timeout_s)


def exec_response(returncode: int, stdout: str, stderr: str) -> dict[str, Any]:
    """The OSWorld ``/execute`` answer."""
    return {
        "status": "success" if returncode == 0 else "error",
        "output": stdout,
        "error": stderr,
        "returncode": returncode,
    }


def parse_action(body: Any) -> Action:
    """A ``/action`` body (the fields of :class:`dart.events.ParsedAction`) as a typed action.

    Wrong field types are a :class:`ProtocolError`; a well-formed body with a bad value
    (unknown kind, missing coordinate) becomes :class:`InvalidAction`, which the agent
    answers with 400 without touching the screen.
    """
    if not isinstance(body, dict):
        raise ProtocolError(f"expected a JSON object with the ParsedAction fields, got {type(body).__name__}")
    unknown = set(body) - set(_ACTION_FIELDS)
    if unknown:
        raise ProtocolError(f"unknown action fields {sorted(unknown)}; allowed: {sorted(_ACTION_FIELDS)}")
    fields: dict[str, Any] = {}
    for name, kind in _ACTION_FIELDS.items():
        value = body.get(name)
        if value is None:
            fields[name] = None
        elif kind is float:
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
                raise ProtocolError(f"action field {name!r} must be a finite number, got {value!r}")
            fields[name] = float(value)
        elif not isinstance(value, str):
            raise ProtocolError(f"action field {name!r} must be a string, got {value!r}")
        else:
            fields[name] = value
    if fields["kind"] is None:
        raise ProtocolError("action needs a 'kind'")
    return from_wire(ParsedAction(**fields))


def action_body(parsed: ParsedAction) -> dict[str, Any]:
    """The ``/action`` request body for a wire action (fields that are set only)."""
    return {name: getattr(parsed, name) for name in _ACTION_FIELDS if getattr(parsed, name) is not None}


def parse_path(value: Any, field: str = "file_path") -> str:
    if not isinstance(value, str) or not value:
        raise ProtocolError(f"'{field}' must be a non-empty path, got {value!r}")
    if "\x00" in value:
        raise ProtocolError(f"'{field}' contains a NUL byte")
    return value


def parse_window(body: Any) -> WindowRequest:
    if not isinstance(body, dict):
        raise ProtocolError("expected a JSON object with 'window_name'")
    name = body.get("window_name")
    if not isinstance(name, str) or not name:
        raise ProtocolError(f"'window_name' must be a non-empty string, got {name!r}")
    strict, by_class = body.get("strict", False), body.get("by_class", False)
    if not isinstance(strict, bool) or not isinstance(by_class, bool):
        raise ProtocolError("'strict' and 'by_class' must be true or false")
    return WindowRequest(window_name=name, strict=strict, by_class=by_class)


def window_search_argv(req: WindowRequest) -> list[str]:
    """``xdotool search`` argv that finds the window (OSWorld matches a title substring unless strict)."""
    pattern = f"^{re.escape(req.window_name)}$" if req.strict else re.escape(req.window_name)
    return ["xdotool", "search", "--onlyvisible", "--class" if req.by_class else "--name", pattern]


def _timeout(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= MAX_EXEC_TIMEOUT_S:
        raise ProtocolError(f"'timeout' must be seconds in (0, {MAX_EXEC_TIMEOUT_S:g}], got {value!r}")
    return float(value)
