"""A run named by its directory: what `dart up` wrote there says where everything of the run is.

`dart up` writes ``RUN_DIR/run.json`` (:func:`write_descriptor`) as soon as its broker answers,
and marks it stopped when it exits. Every command that reads a run takes ``--run RUN_DIR`` and
finds the broker address, topic prefix, store, blobs, archive and TensorBoard directory here;
explicit flags (``--bootstrap``, ``--prefix``, ``--dsn`` ...) still win, for remote clusters.

Nothing here creates a directory: a command only asked to read a run never leaves one behind.
"""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

from dart.errors import ConfigError, DartError

DESCRIPTOR = "run.json"
RUN_HELP = ("the run's directory (what `dart up` wrote, e.g. runs/local): its broker, topic prefix, store and "
            "blobs; explicit flags still win")


class RunMissing(DartError, FileNotFoundError):
    """A run directory, or a part of it a command needs, is not there."""


@dataclass(frozen=True)
class RunInfo:
    """Where one run's parts are (absolute paths); ``run.json`` holds exactly these fields."""

    run_id: str
    workdir: str
    bootstrap: str | None
    prefix: str
    store_dsn: str
    database: str
    blobs: str
    log_dir: str
    tensorboard: str
    config: str | None = None
    """The stack config `dart up` ran (for `dart eval --run`)."""
    pid: int | None = None
    """`dart up`'s process while it runs; None once it has stopped (and its dev broker with it)."""

    @property
    def live(self) -> bool:
        """`dart up` of this run is still running (so its broker answers, unless it is a remote one)."""
        if self.pid is None:
            return False
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True


def tensorboard_dir(workdir: Path, run_id: str) -> Path:
    """TensorBoard files of a run: one folder per run id, so that ``tensorboard --logdir`` over
    several runs names each by its id (a run's files straight in the logdir are named ``.``)."""
    return workdir / "tensorboard" / run_id


def write_descriptor(workdir: Path, *, run_id: str, bootstrap: str, prefix: str, config: Path | None,
                     pid: int | None) -> RunInfo:
    """``WORKDIR/run.json`` of a run of `dart up` (``pid`` None: it has stopped)."""
    workdir = workdir.resolve()
    info = RunInfo(run_id=run_id, workdir=str(workdir), bootstrap=bootstrap, prefix=prefix,
                   store_dsn=f"chdb://{workdir / 'chdb'}", database="dart", blobs=str(workdir / "blobs"),
                   log_dir=str(workdir / "log"), tensorboard=str(tensorboard_dir(workdir, run_id)),
                   config=str(config.resolve()) if config is not None else None, pid=pid)
    tmp = workdir / f".{DESCRIPTOR}.tmp"
    tmp.write_text(json.dumps(asdict(info), indent=1) + "\n")
    tmp.replace(workdir / DESCRIPTOR)
    return info


def mark_stopped(workdir: Path) -> None:
    """`dart up` has exited: its dev broker is gone; the store, blobs and archive stay."""
    path = workdir / DESCRIPTOR
    if path.exists():
        data = json.loads(path.read_text())
        data["pid"] = None
        path.write_text(json.dumps(data, indent=1) + "\n")


def open_run(path: str | Path) -> RunInfo:
    """The run in ``path``; :class:`RunMissing` names what is not there and what makes it."""
    where = Path(path)
    if not where.is_dir():
        raise RunMissing(f"no run directory {where} (`make run` or `dart up CONFIG` makes one; "
                         f"its workdir is the run directory)")
    descriptor = where / DESCRIPTOR
    if not descriptor.exists():
        raise RunMissing(f"{where} is not a run directory: no {DESCRIPTOR} in it (`dart up` writes one; "
                         f"a run made before dart wrote it: name its parts with --bootstrap/--prefix/--dsn)")
    try:
        data = json.loads(descriptor.read_text())
        return RunInfo(**{k: v for k, v in data.items() if k in RunInfo.__dataclass_fields__})
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"{descriptor}: not a run descriptor ({exc})") from exc


def add_run_arg(p: argparse.ArgumentParser) -> None:
    """``--run RUN_DIR`` on a command that reads a run."""
    p.add_argument("--run", metavar="RUN_DIR", help=RUN_HELP)


def run_of(args: argparse.Namespace) -> RunInfo | None:
    """The run ``--run`` names, or None."""
    path = getattr(args, "run", None)
    return open_run(path) if path else None


def live_bus(run: RunInfo) -> tuple[str, str]:
    """(bootstrap, prefix) of a run whose broker should answer now; :class:`RunMissing` if the run
    has stopped (its dev broker stopped with it)."""
    if run.bootstrap is None or not run.live:
        raise RunMissing(f"the run in {run.workdir} is not running (its `dart up` has exited, and its dev broker "
                         f"with it): read its archive instead (`dart log ls {run.workdir}`), or its store "
                         f"(`dart sql --run {run.workdir} ...`)")
    return run.bootstrap, run.prefix


def fill_from_run(args: argparse.Namespace, run: RunInfo, **fields: str) -> None:
    """Set each ``args.<flag>`` still unset to the run's ``<field>`` (flags win over the run)."""
    for flag, field in fields.items():
        if getattr(args, flag, None) is None:
            setattr(args, flag, getattr(run, field))


def require_store(path: Path) -> None:
    """:class:`RunMissing` unless an embedded store's directory exists (reading must not create it)."""
    if not path.is_dir():
        raise RunMissing(f"no store at {path} (a data manager writes one; `make run` writes runs/local/chdb): "
                         f"name it with --run RUN_DIR, --dsn chdb:///abs/path or --url http://host:port")
