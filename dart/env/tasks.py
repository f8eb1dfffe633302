"""OSWorld-format task files as typed, frozen tasks, and pools that refuse what cannot run.

A task file holds ``id, instruction, snapshot, source, related_apps, config[]`` (setup steps)
and an ``evaluator`` (``func``, ``result``, ``expected``, ``options``, ``conj``,
``postconfig[]``). OSWorld writes ``func``/``result``/``expected``/``options`` either as
single values or as lists; :class:`EvaluatorSpec` always holds parallel tuples.

A pool is checked when it is loaded: a task with a setup step, getter or metric this project
cannot run, or one that overlaps a held-out test list, is refused then, with the task ids
named — not halfway through a training run.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from dart.errors import ConfigError

OptionCheck = Callable[[Mapping[str, Any]], list[str]]
"""The unsupported parts of one metric's options (e.g. a compare_table rule type)."""


@dataclass(frozen=True, slots=True)
class SetupStep:
    """One ``config`` / ``postconfig`` step, e.g. ``launch`` with ``{"command": [...]}``."""

    type: str
    parameters: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Getter:
    """Where a metric's input comes from, e.g. ``vm_file`` with ``{"path": ..., "dest": ...}``."""

    type: str
    params: dict[str, Any]


@dataclass(frozen=True, kw_only=True, slots=True)
class EvaluatorSpec:
    """Parallel tuples: metric ``funcs[i]`` scores ``results[i]`` against ``expected[i]``."""

    funcs: tuple[str, ...]
    results: tuple[Getter | None, ...]
    expected: tuple[Getter | None, ...]
    options: tuple[dict[str, Any], ...]
    conj: Literal["and", "or"] = "and"
    """How several metrics combine: and = 0 if any is 0 else the mean; or = the max."""
    postconfig: tuple[SetupStep, ...] = ()
    """Steps the backend runs after the episode and before the getters (save files, close apps)."""

    def __post_init__(self) -> None:
        n = len(self.funcs)
        if n == 0:
            raise ConfigError("evaluator.func is empty")
        if not (len(self.results) == len(self.expected) == len(self.options) == n):
            raise ConfigError(
                f"evaluator has {n} funcs but {len(self.results)} results, {len(self.expected)} expected "
                f"and {len(self.options)} options; give one of each per func"
            )
        if self.conj not in ("and", "or"):
            raise ConfigError(f"evaluator.conj must be 'and' or 'or', got {self.conj!r}")

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], *, where: str = "evaluator") -> EvaluatorSpec:
        if not isinstance(d, Mapping) or "func" not in d:
            raise ConfigError(f"{where}: needs an object with 'func'")
        funcs_raw = d["func"]
        many = isinstance(funcs_raw, list)
        funcs = tuple(funcs_raw) if many else (funcs_raw,)
        if not all(isinstance(f, str) and f for f in funcs):
            raise ConfigError(f"{where}.func must be a metric name or a list of them, got {funcs_raw!r}")
        n = len(funcs)
        return cls(
            funcs=funcs,
            results=_getters(d.get("result"), n, many, f"{where}.result"),
            expected=_getters(d.get("expected"), n, many, f"{where}.expected"),
            options=_options(d.get("options"), n, f"{where}.options"),
            conj=d.get("conj", "and"),
            postconfig=_steps(d.get("postconfig"), f"{where}.postconfig"),
        )


def _getter(raw: Any, where: str) -> Getter | None:
    if raw is None:
        return None
    if not isinstance(raw, Mapping) or not isinstance(raw.get("type"), str):
        raise ConfigError(f"{where}: a getter is an object with a 'type', got {raw!r}")
    return Getter(raw["type"], {k: v for k, v in raw.items() if k != "type"})


def _getters(raw: Any, n: int, many: bool, where: str) -> tuple[Getter | None, ...]:
    if raw is None:
        return (None,) * n
    if isinstance(raw, list):
        if not many or len(raw) != n:
            raise ConfigError(f"{where}: {len(raw)} getters for {n} funcs")
        return tuple(_getter(g, f"{where}[{i}]") for i, g in enumerate(raw))
    # One getter given for several funcs: OSWorld shares it.
    return (_getter(raw, where),) * n


def _options(raw: Any, n: int, where: str) -> tuple[dict[str, Any], ...]:
    if raw is None:
        return ({},) * n
    if isinstance(raw, list):
        if len(raw) != n:
            raise ConfigError(f"{where}: {len(raw)} option sets for {n} funcs")
        if not all(o is None or isinstance(o, Mapping) for o in raw):
            raise ConfigError(f"{where}: every entry must be an object or null")
        return tuple(dict(o or {}) for o in raw)
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{where}: must be an object or a list of objects, got {type(raw).__name__}")
    return (dict(raw),) * n


def _steps(raw: Any, where: str) -> tuple[SetupStep, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise ConfigError(f"{where}: must be a list of steps")
    out = []
    for i, s in enumerate(raw):
        if not isinstance(s, Mapping) or not isinstance(s.get("type"), str):
            raise ConfigError(f"{where}[{i}]: a step is an object with a 'type', got {s!r}")
        params = s.get("parameters") or {}
        if not isinstance(params, Mapping):
            raise ConfigError(f"{where}[{i}].parameters must be an object")
        out.append(SetupStep(s["type"], dict(params)))
    return tuple(out)


@dataclass(frozen=True, kw_only=True, slots=True)
class Task:
    id: str
    instruction: str
    snapshot: str
    source: str
    domain: str
    """The task's folder in OSWorld's examples tree (chrome, os, ...); empty if unknown."""
    related_apps: tuple[str, ...]
    config: tuple[SetupStep, ...]
    """Setup steps the backend runs on reset, in order."""
    evaluator: EvaluatorSpec
    raw: dict[str, Any] = field(repr=False, compare=False)
    """The file's JSON as read (for re-publishing the catalogue unchanged)."""

    def __hash__(self) -> int:  # ids are unique in a pool; the dict fields are not hashable
        return hash(self.id)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], *, domain: str = "") -> Task:
        if not isinstance(d, Mapping):
            raise ConfigError(f"a task is a JSON object, got {type(d).__name__}")
        tid = d.get("id")
        if not isinstance(tid, str) or not tid:
            raise ConfigError("task has no 'id'")
        if not isinstance(d.get("instruction"), str):
            raise ConfigError(f"task {tid}: 'instruction' must be a string")
        apps = d.get("related_apps") or []
        if not isinstance(apps, list):
            raise ConfigError(f"task {tid}: 'related_apps' must be a list")
        return cls(
            id=tid,
            instruction=d["instruction"],
            snapshot=str(d.get("snapshot") or ""),
            source=str(d.get("source") or ""),
            domain=domain,
            related_apps=tuple(str(a) for a in apps),
            config=_steps(d.get("config"), f"task {tid}: config"),
            evaluator=EvaluatorSpec.from_dict(d.get("evaluator"), where=f"task {tid}: evaluator"),
            raw=dict(d),
        )


def load_task(path: str | Path) -> Task:
    """One task file; its domain is the name of the folder it sits in."""
    p = Path(path)
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(f"cannot read task file {p}: {exc}") from exc
    try:
        return Task.from_dict(data, domain=p.parent.name)
    except ConfigError as exc:
        raise ConfigError(f"{p}: {exc}") from exc


# ---------------------------------------------------------------------------------------------
# Id lists (test_all.json, dart_trainset_181.json) and loading many tasks


def _is_id_list(data: Any) -> bool:
    if isinstance(data, list):
        return all(isinstance(i, str) for i in data)
    return (
        isinstance(data, Mapping)
        and "evaluator" not in data
        and all(isinstance(v, list) and all(isinstance(i, str) for i in v) for v in data.values())
    )


def load_id_list(path: str | Path) -> dict[str, tuple[str, ...]]:
    """``{domain: (task ids...)}`` from a ``test_all.json``-style file (a plain JSON list of ids
    is read as the domain ``""``)."""
    p = Path(path)
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(f"cannot read id list {p}: {exc}") from exc
    if not _is_id_list(data):
        raise ConfigError(f"{p} is not an id list: expected {{domain: [task ids]}} or [task ids]")
    if isinstance(data, list):
        return {"": tuple(data)}
    return {str(k): tuple(v) for k, v in data.items()}


def ids_of(id_list: Mapping[str, Iterable[str]]) -> frozenset[str]:
    """Every task id of an id list, whatever its domain."""
    return frozenset(i for ids in id_list.values() for i in ids)


def _resolve_ids(id_list: Mapping[str, Iterable[str]], examples_root: Path, where: Path) -> list[Path]:
    paths, missing = [], []
    for domain, ids in id_list.items():
        for tid in ids:
            candidates = [examples_root / domain / f"{tid}.json"] if domain else []
            candidates += sorted(examples_root.glob(f"*/{tid}.json"))
            found = next((c for c in candidates if c.is_file()), None)
            if found is None:
                missing.append(f"{domain}/{tid}")
            else:
                paths.append(found)
    if missing:
        raise ConfigError(
            f"{where}: {len(missing)} task ids have no file under {examples_root} "
            f"(first: {', '.join(missing[:5])}); pass the right examples folder"
        )
    return paths


def load_tasks(paths_or_dirs: Iterable[str | Path], *, examples_root: str | Path | None = None) -> list[Task]:
    """Tasks from task files, folders (every task file below them, id lists skipped) and id-list
    files (each id resolved to ``examples_root/<domain>/<id>.json``). The same file is read once."""
    files: list[Path] = []
    for raw in paths_or_dirs:
        p = Path(raw)
        if p.is_dir():
            files += [f for f in sorted(p.rglob("*.json")) if not _is_id_list(_peek(f))]
        elif p.is_file():
            data = _peek(p)
            if _is_id_list(data):
                if examples_root is None:
                    raise ConfigError(f"{p} is an id list; give examples_root to find its task files")
                files += _resolve_ids(load_id_list(p), Path(examples_root), p)
            else:
                files.append(p)
        else:
            raise ConfigError(f"no task file or folder at {p}")
    seen: set[Path] = set()
    tasks = []
    for f in files:
        key = f.resolve()
        if key not in seen:
            seen.add(key)
            tasks.append(load_task(f))
    return tasks


def _peek(p: Path) -> Any:
    try:
        return json.loads(p.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(f"cannot read {p}: {exc}") from exc


# ---------------------------------------------------------------------------------------------
# What a backend can run, and pools that refuse the rest


@dataclass(frozen=True, slots=True)
class Capabilities:
    """Names this project can run on one backend (build one with
    ``dart.env.evaluators.capabilities(setup_types)``)."""

    setup_types: frozenset[str]
    getters: frozenset[str]
    metrics: frozenset[str]
    option_checks: Mapping[str, OptionCheck] = field(default_factory=dict, compare=False, hash=False)
    """metric name -> fn(options) -> unsupported parts of those options (e.g. a compare_table rule)."""
    unavailable_programs: Mapping[str, str] = field(default_factory=dict, compare=False, hash=False)
    """program a step starts -> why this backend cannot have it (e.g. VS Code: not in Debian)."""


def unsupported_parts(task: Task, caps: Capabilities) -> list[str]:
    """What in ``task`` cannot run with ``caps``, as ``kind:name`` strings
    (``setup:googledrive``, ``postconfig:launch``, ``getter:cloud_file``, ``metric:compare_pdfs``,
    ``option:compare_table:rule chart``); empty if it can run."""
    parts: list[str] = []
    ev = task.evaluator
    parts += [f"setup:{s.type}" for s in task.config if s.type not in caps.setup_types]
    parts += [f"postconfig:{s.type}" for s in ev.postconfig if s.type not in caps.setup_types]
    parts += [f"app:{p}" for p in dict.fromkeys(_programs(task)) if p in caps.unavailable_programs]
    for func, result, expected, options in zip(ev.funcs, ev.results, ev.expected, ev.options, strict=True):
        if func not in caps.metrics:
            parts.append(f"metric:{func}")
        elif func in caps.option_checks:
            parts += [f"option:{func}:{p}" for p in caps.option_checks[func](options)]
        parts += [
            f"getter:{g.type}" for g in (result, expected) if g is not None and g.type not in caps.getters
        ]
    return list(dict.fromkeys(parts))


def _programs(task: Task) -> Iterator[str]:
    """Every word of the commands a task's steps and command getters run, as program names
    (a shell line's words too: ``a | b && c`` starts three programs)."""
    ev = task.evaluator
    commands = [s.parameters.get("command") for s in (*task.config, *ev.postconfig)
                if s.type in ("launch", "execute", "command")]
    commands += [g.params.get("command") for g in (*ev.results, *ev.expected)
                 if g is not None and g.type in ("vm_command_line", "vm_command_error")]
    for cmd in commands:
        words = cmd.split() if isinstance(cmd, str) else [w for a in cmd or [] if isinstance(a, str) for w in a.split()]
        for w in words:
            yield w.strip("'\"();").rsplit("/", 1)[-1]


@dataclass(frozen=True, kw_only=True, slots=True)
class PoolReport:
    """Why a set of tasks would be refused as a pool (all empty: it would be accepted)."""

    unsupported: dict[str, list[str]]
    """task id -> its unsupported parts, for the tasks that have any."""
    holdout_overlap: tuple[str, ...]
    duplicate_ids: tuple[str, ...]

    @property
    def ok(self) -> bool:
        return not (self.unsupported or self.holdout_overlap or self.duplicate_ids)

    def problems(self, limit: int = 10) -> list[str]:
        out = []
        if self.holdout_overlap:
            ids = ", ".join(self.holdout_overlap[:limit])
            out.append(
                f"{len(self.holdout_overlap)} tasks are in the held-out test list ({ids}"
                f"{', ...' if len(self.holdout_overlap) > limit else ''}); train on tasks outside it"
            )
        if self.unsupported:
            items = list(self.unsupported.items())
            shown = "; ".join(f"{tid}: {', '.join(parts)}" for tid, parts in items[:limit])
            more = f"; and {len(items) - limit} more" if len(items) > limit else ""
            out.append(f"{len(items)} tasks need parts this backend cannot run ({shown}{more})")
        if self.duplicate_ids:
            out.append(f"duplicate task ids: {', '.join(self.duplicate_ids[:limit])}")
        return out


def check_pool(
    tasks: Iterable[Task], caps: Capabilities, holdout_ids: Iterable[str] | None = None
) -> PoolReport:
    """Everything that keeps ``tasks`` from being a training pool (pure; nothing raised)."""
    holdout = frozenset(holdout_ids or ())
    unsupported: dict[str, list[str]] = {}
    seen: set[str] = set()
    dups: list[str] = []
    overlap: list[str] = []
    for t in tasks:
        if t.id in seen:
            dups.append(t.id)
        seen.add(t.id)
        if t.id in holdout:
            overlap.append(t.id)
        parts = unsupported_parts(t, caps)
        if parts:
            unsupported[t.id] = parts
    return PoolReport(unsupported=unsupported, holdout_overlap=tuple(overlap), duplicate_ids=tuple(dups))


@dataclass(frozen=True, slots=True)
class TaskPool:
    """Tasks that every part of a run can execute and that stay clear of the held-out list."""

    tasks: tuple[Task, ...]

    @classmethod
    def load(
        cls,
        paths: Iterable[str | Path],
        *,
        caps: Capabilities,
        holdout_ids: set[str] | frozenset[str] | None = None,
        examples_root: str | Path | None = None,
    ) -> TaskPool:
        """Load and check; ConfigError naming the task ids and parts if anything would fail."""
        return cls.of(load_tasks(paths, examples_root=examples_root), caps=caps, holdout_ids=holdout_ids)

    @classmethod
    def of(
        cls, tasks: Iterable[Task], *, caps: Capabilities, holdout_ids: Iterable[str] | None = None
    ) -> TaskPool:
        tasks = tuple(tasks)
        if not tasks:
            raise ConfigError("the task pool is empty; give task files, folders or id lists")
        report = check_pool(tasks, caps, holdout_ids)
        if not report.ok:
            raise ConfigError("refusing the task pool: " + " | ".join(report.problems()))
        return cls(tasks)

    @property
    def ids(self) -> tuple[str, ...]:
        return tuple(t.id for t in self.tasks)

    def get(self, task_id: str) -> Task:
        for t in self.tasks:
            if t.id == task_id:
                return t
        raise KeyError(task_id)

    def __len__(self) -> int:
        return len(self.tasks)

    def __iter__(self) -> Iterator[Task]:
        return iter(self.tasks)
