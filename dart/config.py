"""Typed, frozen configs built from YAML/JSON mappings and dotted command-line overrides; a
mistake names the field.

Configs are ``@dataclass(frozen=True, kw_only=True)`` classes owned by the package that uses
them; each field's docstring (the string literal under it) is its help text. ``build``
turns a nested mapping into such a class and refuses unknown fields, wrong types and failed
``__post_init__`` checks with the dotted path of the field, at start-up. pydantic checks the
types of the plain dataclasses (no base class, no second schema); the file and the command
line's ``KEY=VALUE`` overrides are merged here (:func:`config_from_args`).
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import contextvars
import dataclasses
import datetime
import functools
import inspect
import itertools
import json
import logging
import os
import sys
import textwrap
import typing
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, TypeVar

import pydantic
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


def build(cls: type[T], data: Mapping[str, Any] | None, *, path: str = "", base: Any = None) -> T:
    """An instance of the config dataclass ``cls`` from a mapping; ConfigError names the field.

    The mapping is laid over ``base`` (an instance of ``cls``), else over ``cls``'s own defaults,
    nested objects too: ``recipe: {loss: {tis: off}}`` changes only ``tis`` of the recipe's loss.
    pydantic checks the types (``Literal``, unions, tuples, paths, nested dataclasses) and refuses
    unknown fields; each class's ``__post_init__`` checks the values."""
    if data is not None and not isinstance(data, Mapping):
        raise ConfigError(f"{path or 'config'} must be a mapping, got {type(data).__name__}")
    if base is not None:
        under = as_mapping(base)
    elif hasattr(cls, "config_defaults"):  # a config whose defaults depend on the file (StackConfig)
        under = cls.config_defaults(dict(data or {}))
    else:
        under = defaults_of(cls)
    merged = merge(under, dict(data or {}))
    try:
        return _adapter(cls).validate_python(_expand_paths(cls, merged))
    except pydantic.ValidationError as exc:
        raise ConfigError(_describe(exc.errors()[0], path, cls)) from exc


def _describe(error: Any, path: str, cls: type) -> str:
    """One pydantic error as dart says it: the dotted field first."""
    loc = [path] if path else []
    for part in error["loc"]:
        if isinstance(part, int):
            loc[-1:] = [f"{loc[-1] if loc else ''}[{part}]"]
        elif part not in _UNION_TAGS and "[" not in str(part):  # union branches pydantic names in the location
            loc.append(str(part))
    where = ".".join(loc)
    kind = error["type"]
    if kind in ("unexpected_keyword_argument", "extra_forbidden"):
        return f"unknown field {where}"
    if kind == "missing" or kind == "missing_keyword_only_argument":
        return f"missing required field {where}"
    if kind == "value_error":  # a __post_init__ check: its message names the field already
        message = str(error["ctx"]["error"])
        for k in range(len(loc), 0, -1):  # the check may name the field from a level up: optim.lr
            if message.startswith((f"{'.'.join(loc[-k:])}.", f"{'.'.join(loc[-k:])}:")):
                return ".".join([*loc[:-k], message])
        return ".".join([*loc, message])
    message = error["msg"]
    return f"{where or cls.__name__}: {message[:1].lower()}{message[1:]}, got {error['input']!r}"


_UNION_TAGS = frozenset({"str", "int", "float", "bool", "none", "function-after", "function-plain", "is-instance",
                         "lax-or-strict"})


@functools.cache
def _adapter(cls: type) -> pydantic.TypeAdapter:
    _forbid_extra(cls)
    return pydantic.TypeAdapter(cls)


def _forbid_extra(tp: Any) -> None:
    """Unknown keys are refused in ``tp`` and every config class inside it (pydantic reads the
    setting from each stdlib dataclass's ``__pydantic_config__``)."""
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        if "__pydantic_config__" in vars(tp):
            return
        tp.__pydantic_config__ = pydantic.ConfigDict(extra="forbid")  # type: ignore[attr-defined]
        for hint in typing.get_type_hints(tp).values():
            _forbid_extra(hint)
    for arg in typing.get_args(tp):
        _forbid_extra(arg)


def _expand_paths(cls: Any, data: Any) -> Any:
    """``~`` expanded in the strings given to ``Path`` fields (``workdir: ~/runs/a``)."""
    if not (dataclasses.is_dataclass(cls) and isinstance(data, dict)):
        return data
    hints = typing.get_type_hints(cls)
    out = dict(data)
    for name, value in data.items():
        tp = hints.get(name)
        kinds = (tp, *typing.get_args(tp))
        if Path in kinds and isinstance(value, str):
            out[name] = os.path.expanduser(value)
        else:
            inner = next((k for k in kinds if dataclasses.is_dataclass(k)), None)
            out[name] = _expand_paths(inner, value) if inner is not None else value
    return out


def defaults_of(cls: type) -> dict[str, Any]:
    """``cls``'s init fields that have defaults, as a plain mapping (required ones left out)."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        if not f.init:
            continue
        if f.default is not dataclasses.MISSING:
            out[f.name] = _plain(f.default)
        elif f.default_factory is not dataclasses.MISSING:
            out[f.name] = _plain(f.default_factory())
    return out


def as_mapping(obj: Any) -> dict[str, Any]:
    """A config object as the plain mapping (YAML-safe: paths as strings, tuples as lists) that
    ``build`` turns back into an equal object: what `dart up` writes for each service."""
    if not dataclasses.is_dataclass(obj) or isinstance(obj, type):
        raise TypeError(f"not a config object: {obj!r}")
    return {f.name: _plain(getattr(obj, f.name)) for f in dataclasses.fields(obj) if f.init}


def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return as_mapping(value)
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    return value


def merge(base: Mapping[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    """``extra`` laid over ``base``, mappings merged key by key, anything else replaced."""
    out = dict(base)
    for key, value in extra.items():
        inner = out.get(key)
        out[key] = merge(inner, value) if isinstance(value, Mapping) and isinstance(inner, Mapping) else value
    return out


def parse_override(item: str) -> dict[str, Any]:
    """``trainer.loss.tis=token`` as ``{"trainer": {"loss": {"tis": "token"}}}``; the value is an
    int, else a float (``3e-4``, which YAML 1.1 reads as a string), else YAML (``null`` None,
    ``[a, b]`` a list, ``true``), as in a config file."""
    key, sep, text = item.partition("=")
    parts = key.strip().split(".")
    if not sep or not all(p.strip() for p in parts):
        raise ConfigError(f"override {item!r}: expected KEY=VALUE with a dotted key, e.g. env.slots=32")
    try:
        return nested(key, _scalar(text))
    except ConfigError as exc:
        raise ConfigError(f"override {key}: {exc}") from exc


def _scalar(text: str) -> Any:
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            continue
    try:
        return yaml.safe_load(text) if text.strip() else ""
    except yaml.YAMLError as exc:
        raise ConfigError(f"{text!r} is not a YAML value: {exc}") from exc


def nested(key: str, value: Any) -> dict[str, Any]:
    """``nested("a.b", 1) == {"a": {"b": 1}}``."""
    for part in reversed(key.split(".")):
        value = {part.strip(): value}
    return value


def with_overrides(data: Mapping[str, Any], overrides: Iterable[str]) -> dict[str, Any]:
    """A config file's mapping with dotted command-line overrides laid over it, in order."""
    out = dict(data)
    for item in overrides:
        out = merge(out, parse_override(item))
    return out


def add_config_args(p: argparse.ArgumentParser, *, default: Path | None = None, what: str = "") -> None:
    """The config argument every command that takes one shares: ``[CONFIG] [KEY=VALUE ...]`` (and
    ``--config FILE``), read by :func:`config_from_args`."""
    shown = f" (default: {default})" if default is not None else ""
    p.add_argument("config_items", nargs="*", metavar="CONFIG|KEY=VALUE",
                   help=f"YAML config{what}{shown}, then dotted overrides of any of its keys "
                        "(env.slots=32 trainer.loss.tis=token); an unknown key is refused by name")
    p.add_argument("--config", help="the config file (the same as CONFIG)")
    p.set_defaults(config_default=default)


def config_from_args(args: argparse.Namespace, *, flags: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The mapping of ``add_config_args``'s file with ``flags`` (a command's own options, by dotted
    key) and then the command line's overrides laid over it; sets ``args.config`` to the file
    (the bus reads its section from it)."""
    items = list(getattr(args, "config_items", None) or [])
    files = [i for i in items if "=" not in i]
    given = getattr(args, "config", None)
    if len(files) > 1 or (files and items[0] != files[0]) or (files and given and given != files[0]):
        raise ConfigError(f"one config file, before the KEY=VALUE overrides; got {' '.join(items)}")
    args.config = given or (files[0] if files else None) or getattr(args, "config_default", None)
    data = load_yaml(args.config) if args.config else {}
    for key, value in (flags or {}).items():
        if value is not None:
            data = merge(data, nested(key, str(value) if isinstance(value, Path) else value))
    args.config_data = with_overrides(data, [i for i in items if "=" in i])
    return args.config_data


def config_mapping(args: argparse.Namespace) -> dict[str, Any]:
    """The whole config a command was given: ``[CONFIG] [KEY=VALUE ...]`` read once (see
    :func:`config_from_args`), or the ``--config`` file of a command without overrides; each
    section's reader (the bus's, the service's) takes its part of it."""
    if getattr(args, "config_data", None) is not None:
        return args.config_data
    if hasattr(args, "config_items"):
        return config_from_args(args)
    return load_yaml(args.config) if getattr(args, "config", None) else {}


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
