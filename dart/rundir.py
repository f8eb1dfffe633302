"""A run named by its directory: what `dart up` wrote there says where everything of the run is.

`dart up` writes ``RUN_DIR/run.json`` (:func:`write_descriptor`) as soon as its broker answers,
and marks it stopped when it exits. Every command that reads a run takes ``--run RUN_DIR`` and
finds the broker address, topic prefix, store, blobs, archive and TensorBoard directory here;
explicit flags (``--bootstrap``, ``--prefix``, ``--dsn`` ...) still win, for remote clusters.

Nothing here creates a directory: a command only asked to read a run never leaves one behind.

A run directory is data, whoever made it: every part of a run is where the directory is (what
``run.json`` says of paths is not followed, so a copied run reads its own parts), a store
address other than the run's own chdb is refused, and the broker ``run.json`` names is used
only as :func:`live_bus` allows. ``dart`` checks the run's store before any command reads the
run (``dart.data.storecheck``, called where the command line is parsed); ``--trust-run`` skips that.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from dart.errors import ConfigError, DartError

DESCRIPTOR = "run.json"
RUN_HELP = ("the run's directory (what `dart up` wrote, e.g. runs/local): its broker, topic prefix, store and "
            "blobs; explicit flags still win")
TRUST_HELP = ("open the run's store even if it holds definitions that would run programs or reach the network "
              "(only for a run whose maker you trust)")


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
    def root(self) -> Path:
        return Path(self.workdir)

    @property
    def store(self) -> Path:
        """The run's embedded store (``chdb://`` of it is :attr:`store_dsn`)."""
        return self.root / "chdb"

    @property
    def log(self) -> Path:
        """The run's archived event log."""
        return self.root / "log"

    @property
    def live(self) -> bool:
        """`dart up` of this run is still running (so its broker answers, unless it is a remote one):
        ``pid`` is a dart process of this user (a pid from another machine's run.json is, most
        likely, some other program or another user's)."""
        if self.pid is None:
            return False
        try:
            os.kill(self.pid, 0)
        except (ProcessLookupError, PermissionError):
            return False
        try:
            return b"dart" in Path(f"/proc/{self.pid}/cmdline").read_bytes()
        except OSError:
            return sys.platform != "linux"  # no /proc to ask: the signal answered


def tensorboard_dir(workdir: Path, run_id: str) -> Path:
    """TensorBoard files of a run: one folder per run id, so that ``tensorboard --logdir`` over
    several runs names each by its id (a run's files straight in the logdir are named ``.``)."""
    return workdir / "tensorboard" / run_id


def _parts(workdir: Path, run_id: str) -> dict[str, str]:
    """Where a run's parts are: always inside its directory."""
    return {"workdir": str(workdir), "store_dsn": f"chdb://{workdir / 'chdb'}", "blobs": str(workdir / "blobs"),
            "log_dir": str(workdir / "log"), "tensorboard": str(tensorboard_dir(workdir, run_id))}


def write_descriptor(workdir: Path, *, run_id: str, bootstrap: str, prefix: str, config: Path | None,
                     pid: int | None) -> RunInfo:
    """``WORKDIR/run.json`` of a run of `dart up` (``pid`` None: it has stopped)."""
    workdir = workdir.resolve()
    info = RunInfo(run_id=run_id, bootstrap=bootstrap, prefix=prefix, database="dart", **_parts(workdir, run_id),
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


def open_run(path: str | Path, *, trust: bool = False) -> RunInfo:
    """The run in ``path`` (a directory without ``run.json``: a run made before dart wrote one, whose
    broker is unknown); :class:`RunMissing` names what is not there and what makes it. Its parts
    are in ``path`` whatever run.json says (``trust``: a store address there is ignored, not refused)."""
    where = Path(path)
    if not where.is_dir():
        raise RunMissing(f"no run directory {where} (`make run` or `dart up CONFIG` makes one; "
                         f"its workdir is the run directory)")
    workdir = where.resolve()
    descriptor = where / DESCRIPTOR
    if not descriptor.exists():
        return RunInfo(run_id=workdir.name, bootstrap=None, prefix="dart", database="dart",
                       **_parts(workdir, workdir.name))
    try:
        data = json.loads(descriptor.read_text())
        run = RunInfo(**{k: v for k, v in data.items() if k in RunInfo.__dataclass_fields__})
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"{descriptor}: not a run descriptor ({exc})") from exc
    if not trust and not str(run.store_dsn).startswith("chdb://"):
        # dart writes only the run's own chdb here: a server address would get your queries (and,
        # before this check, $CLICKHOUSE_PASSWORD). A server is named on the command line (--url).
        raise UntrustedRun(f"{descriptor} names the store {run.store_dsn}, not the run's own {workdir / 'chdb'}: "
                           f"refused (a run directory does not choose where dart connects); to read a server, "
                           f"name it yourself with --url")
    return replace(run, **_parts(workdir, str(run.run_id)))


class UntrustedRun(DartError, PermissionError):
    """A run directory holds something that would run, or reach out, when read."""


def add_run_arg(p: argparse.ArgumentParser, *, positional: Callable[[argparse.Namespace], str | None] | None = None,
                ) -> None:
    """``--run RUN_DIR`` (and ``--trust-run``) on a command that reads a run: the one way to name one.
    ``positional`` reads the run directory from a command's older positional form, if it has one.
    `dart` opens and checks the run before the command runs (``args.run`` is then a :class:`RunInfo`)."""
    p.add_argument("--run", metavar="RUN_DIR", help=RUN_HELP)
    p.add_argument("--trust-run", action="store_true", help=TRUST_HELP)
    p.set_defaults(run_positional=positional)


def run_path(args: argparse.Namespace) -> str | None:
    """The run directory a command was given: ``--run``, else its positional form, else None."""
    named = getattr(args, "run", None)
    if named is None and getattr(args, "run_positional", None) is not None:
        named = args.run_positional(args)
    return None if named is None else str(named)


def run_of(args: argparse.Namespace) -> RunInfo | None:
    """The run the command names, or None (opened already where ``dart`` parsed the command line)."""
    run = getattr(args, "run", None)
    return run if isinstance(run, RunInfo) or run is None else open_run(run)


def live_bus(run: RunInfo, *, configured: str | None, secret: bool) -> tuple[str, str]:
    """(bootstrap, prefix) of a run whose broker should answer now, said on stderr before anything
    contacts it. :class:`RunMissing` if the run has stopped (its dev broker stopped with it);
    :class:`UntrustedRun` if run.json names a broker the user did not: one off this machine, or,
    where the environment holds a Kafka password (``secret``), any but ``configured``
    ($DART_BOOTSTRAP): credentials go only where the user said."""
    if run.bootstrap is None or not run.live:
        raise RunMissing(f"the run in {run.workdir} is not running (its `dart up` has exited, and its dev broker "
                         f"with it): read its archive instead (`dart log ls {run.workdir}`), or its store "
                         f"(`dart sql --run {run.workdir} ...`)")
    if run.bootstrap != configured and (secret or not is_loopback(run.bootstrap)):
        why = "your Kafka credentials go only to $DART_BOOTSTRAP" if secret else "it is not on this machine"
        raise UntrustedRun(f"{Path(run.workdir) / DESCRIPTOR} names the broker {run.bootstrap}: not contacted ({why}); "
                           f"to read it, name it yourself with --bootstrap {run.bootstrap}")
    print(f"dart: the run in {run.workdir}: its broker {run.bootstrap} (from {DESCRIPTOR})", file=sys.stderr)
    return run.bootstrap, run.prefix


def is_loopback(address: str) -> bool:
    """Every host of a ``host:port[,host:port]`` list is this machine's loopback."""
    hosts = [a.strip().rpartition(":")[0].strip("[]") for a in address.split(",")]
    return all(h in ("localhost", "::1") or h.startswith("127.") for h in hosts)


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
