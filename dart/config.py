"""Typed, frozen configs built from YAML/JSON mappings; a mistake names the field.

Configs are ``@dataclass(frozen=True, kw_only=True)`` classes owned by the package that uses
them; each field's docstring (the string literal under it) is its help text. ``build``
turns a nested mapping into such a class and refuses unknown fields, wrong types and failed
``__post_init__`` checks with the dotted path of the field, at start-up.
"""

from __future__ import annotations

import ast
import contextlib
import contextvars
import dataclasses
import datetime
import inspect
import itertools
import json
import logging
import os
import sys
import textwrap
import types
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal, TypeVar

import yaml

from dart.errors import ConfigError

T = TypeVar("T")


def load_yaml(path: str | Path) -> dict[str, Any]:
    try:
        data = yaml.safe_load(Path(path).read_text()) or {}
    except FileNotFoundError as exc:
        raise ConfigError(f"config file {path} does not exist") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file {path} is not valid YAML: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must hold a mapping at the top, got {type(data).__name__}")
    return data


def build(cls: type[T], data: dict[str, Any] | None, *, path: str = "") -> T:
    """An instance of the config dataclass ``cls`` from a mapping; ConfigError names the field."""
    data = dict(data or {})
    where = f"{path}." if path else ""
    if not isinstance(data, dict):
        raise ConfigError(f"{path or 'config'} must be a mapping, got {type(data).__name__}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}  # type: ignore[arg-type]
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise ConfigError(f"unknown field {where}{unknown[0]} (known: {', '.join(sorted(fields))})")
    kwargs: dict[str, Any] = {}
    for name, value in data.items():
        f = fields[name]
        if isinstance(value, dict) and f.default_factory is not dataclasses.MISSING:
            # A partial mapping for a field whose default is a configured object changes just
            # the fields it names: `recipe: {loss: {tis: off}}` keeps the recipe's other loss
            # settings rather than falling back to the loss class's own defaults.
            default = f.default_factory()
            if dataclasses.is_dataclass(default):
                value = _overlay(default, value)
        kwargs[name] = _coerce(hints[name], value, f"{where}{name}")
    missing = [
        n
        for n, f in fields.items()
        if n not in kwargs and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    ]
    if missing:
        raise ConfigError(f"missing required field {where}{missing[0]}")
    try:
        return cls(**kwargs)
    except ConfigError as exc:
        raise ConfigError(f"{where}{exc}" if where and not str(exc).startswith(where) else str(exc)) from exc
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{path or cls.__name__}: {exc}") from exc


def _overlay(default: Any, mapping: dict[str, Any]) -> dict[str, Any]:
    """``default``'s init fields as a mapping with ``mapping`` laid over it, nested objects too."""
    out: dict[str, Any] = {f.name: getattr(default, f.name) for f in dataclasses.fields(default) if f.init}
    for key, value in mapping.items():
        inner = out.get(key)
        out[key] = _overlay(inner, value) if isinstance(value, dict) and dataclasses.is_dataclass(inner) else value
    return out


def _coerce(tp: Any, value: Any, path: str) -> Any:
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if tp is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(arg, value, path)
            except ConfigError as exc:
                errors.append(str(exc))
        raise ConfigError(errors[0] if errors else f"{path}: bad value {value!r}")
    if origin is Literal:
        if value not in args:
            raise ConfigError(f"{path} must be one of {', '.join(map(repr, args))}, got {value!r}")
        return value
    if dataclasses.is_dataclass(tp):
        if isinstance(value, tp):  # a default object carried over by _overlay
            return value
        if not isinstance(value, dict):
            raise ConfigError(f"{path} must be a mapping, got {value!r}")
        return build(tp, value, path=path)  # type: ignore[arg-type]
    if origin in (list, tuple):
        if not isinstance(value, list | tuple):
            raise ConfigError(f"{path} must be a list, got {value!r}")
        item = args[0] if args else Any
        items = [_coerce(item, v, f"{path}[{i}]") for i, v in enumerate(value)]
        return tuple(items) if origin is tuple else items
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{path} must be a mapping, got {value!r}")
        vt = args[1] if len(args) == 2 else Any
        return {str(k): _coerce(vt, v, f"{path}.{k}") for k, v in value.items()}
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{path} must be true or false, got {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{path} must be an integer, got {value!r}")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(f"{path} must be a number, got {value!r}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{path} must be a string, got {value!r}")
        return value
    if tp is Path:
        if not isinstance(value, str | Path):
            raise ConfigError(f"{path} must be a path, got {value!r}")
        return Path(os.path.expanduser(str(value)))
    return value


def field_docs(cls: type) -> dict[str, str]:
    """Each field's docstring (the string literal under it), for CLI help and docs."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        except (OSError, TypeError):
            continue
        body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
        for prev, node in itertools.pairwise(body):
            if (
                isinstance(prev, ast.AnnAssign)
                and isinstance(prev.target, ast.Name)
                and isinstance(node, ast.Expr)
                and isinstance(node.value, ast.Constant)
                and isinstance(node.value.value, str)
            ):
                docs[prev.target.id] = " ".join(node.value.value.split())
    return docs


def require(cond: bool, field: str, message: str) -> None:
    """Raise ConfigError naming ``field`` unless ``cond`` (for ``__post_init__`` checks)."""
    if not cond:
        raise ConfigError(f"{field}: {message}")


LOG_FORMATS = ("text", "json")
LOG_CONTEXT: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar("dart_log_context", default=None)
"""Fields the JSON log lines of this task carry (the bus's consumer sets those of the record in hand)."""
LOG_FIELDS = ("run_id", "rollout_id", "policy_version")
"""Fields of an event that a log line written while handling it carries."""


@contextlib.contextmanager
def log_context(**fields: Any) -> Iterator[None]:
    """Add ``fields`` (None values left out) to every JSON log line written inside the block."""
    token = LOG_CONTEXT.set({**(LOG_CONTEXT.get() or {}), **{k: v for k, v in fields.items() if v is not None}})
    try:
        yield
    finally:
        LOG_CONTEXT.reset(token)


def event_log_fields(event: Any) -> dict[str, Any]:
    """run_id, rollout_id and policy version (``policy_version``, a weights event's ``version``, a batch's
    ``trainer_version``) of an event."""
    fields = {name: getattr(event, name, None) for name in LOG_FIELDS}
    for other in ("version", "trainer_version"):  # a weights event's, a batch's
        if fields["policy_version"] is None:
            fields["policy_version"] = getattr(event, other, None)
    return fields


class JsonLogFormatter(logging.Formatter):
    """One JSON object per line: time (UTC, ISO 8601), level, logger, message; the service (the
    `dart` command), worker id (``$DART_SERVICE``) and run id (``$DART_RUN_ID``) where set; the
    run id, rollout id and policy version of the record being handled, where there is one; an
    ``extra={...}`` of the call; the traceback as ``exception``."""

    STANDARD = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime"}

    def __init__(self, service: str = "") -> None:
        super().__init__()
        self.service = service

    def format(self, record: logging.LogRecord) -> str:
        when = datetime.datetime.fromtimestamp(record.created, datetime.UTC)
        line: dict[str, Any] = {"time": when.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
                                "level": record.levelname, "logger": record.name, "message": record.getMessage()}
        for key, value in (("service", self.service), ("worker_id", os.environ.get("DART_SERVICE")),
                           ("run_id", os.environ.get("DART_RUN_ID")), ("pid", record.process)):
            if value:
                line[key] = value
        line.update(LOG_CONTEXT.get() or {})
        line.update({k: v for k, v in vars(record).items() if k not in self.STANDARD and not k.startswith("_")})
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str)


def progress_shown() -> bool:
    """Progress bars on a terminal only ($DART_PROGRESS=1 or 0 says otherwise)."""
    forced = os.environ.get("DART_PROGRESS")
    return forced == "1" if forced in ("0", "1") else sys.stderr.isatty()


def progress(iterable: Any = None, *, total: int | None = None, desc: str = "", unit: str = "it") -> Any:
    """A tqdm progress bar on stderr when it is a terminal, else silent: the iterable passes through
    and ``update``/``close`` do nothing (logs and pipes get no bar characters)."""
    from tqdm import tqdm

    return tqdm(iterable, total=total, desc=desc, unit=unit, file=sys.stderr, disable=not progress_shown(),
                dynamic_ncols=True, leave=False)


def setup_logging(verbose: bool = False, log_format: str | None = None, *, service: str = "") -> None:
    """One log line per event worth knowing, on stderr (every service and CLI command calls this
    once at start-up): text (time, level, logger, message), or with ``log_format="json"`` (or
    ``$DART_LOG_FORMAT=json``) one JSON object per line (:class:`JsonLogFormatter`)."""
    log_format = log_format or os.environ.get("DART_LOG_FORMAT") or "text"
    if log_format not in LOG_FORMATS:
        raise ConfigError(f"log format must be one of {', '.join(LOG_FORMATS)}, got {log_format!r}")
    handler = logging.StreamHandler(sys.stderr)
    if log_format == "json":
        handler.setFormatter(JsonLogFormatter(service))
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname).1s %(name)s: %(message)s", "%H:%M:%S"))
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO, handlers=[handler])
    for noisy in ("aiokafka", "kafka", "urllib3", "httpx", "filelock", "asyncio"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
