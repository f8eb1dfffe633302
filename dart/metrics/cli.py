"""`dart metrics`: TensorBoard event files of a run, live from the log or from a finished run's archive."""

from __future__ import annotations

import argparse
import contextlib
import json
from pathlib import Path
from typing import Any

from dart.bus.cli import add_bus_args, bus_from_args
from dart.config import add_config_args, build, config_from_args
from dart.log.cli import log_dir_of
from dart.metrics.sink import MetricsConfig, from_archive, run_live
from dart.rundir import RunInfo, RunMissing, add_run_arg, run_of, tensorboard_dir


def register(sub: Any) -> None:
    p = sub.add_parser(
        "metrics", help="TensorBoard event files from the log: live (a service of `dart up`) or, given RUN_DIR, "
                        "from its archive after the fact (the same records)")
    add_config_args(p, what=" (its `metrics:` section; `bus:` for a live run), or a finished run's directory: "
                            "read RUN_DIR/log (no broker needed), write RUN_DIR/tensorboard/RUN_ID")
    p.add_argument("--out", type=Path, help="directory of the event files")
    p.add_argument("--blobs", help="blob store of the screenshots (default RUN_DIR/blobs)")
    p.add_argument("--image-every-versions", type=int, help="pictures of trajectories at every N policy versions")
    p.add_argument("--images-per-version", type=int, help="trajectories drawn at such a version (0: none)")
    add_run_arg(p, positional=_run_dir_item)  # a finished run (also as RUN_DIR)
    add_bus_args(p, config=False, run=False)  # a live run's broker: --bootstrap, --prefix
    p.set_defaults(func=cmd_metrics)


def _run_dir_item(args: argparse.Namespace) -> str | None:
    """Take RUN_DIR out of ``[CONFIG|RUN_DIR] [KEY=VALUE ...]``: an item that is no override and no
    config file (a directory, or a path that is not there and not named ``*.yaml``)."""
    items = list(getattr(args, "config_items", None) or [])
    for item in items:
        if "=" not in item and not Path(item).is_file() and not item.endswith((".yaml", ".yml")):
            args.config_items = [i for i in items if i is not item]
            return item
    return None


def metrics_config(args: argparse.Namespace, run: RunInfo | None) -> Any:
    flags = {f"metrics.{key}": getattr(args, flag, None)
             for flag, key in (("out", "out_dir"), ("blobs", "blobs"), ("image_every_versions", "image_every_versions"),
                               ("images_per_version", "images_per_version"))}
    data = dict(config_from_args(args, flags=flags).get("metrics") or {})
    if run is not None:
        data.setdefault("out_dir", str(tensorboard_dir(run.root, _run_id(run.root))))
        if Path(run.blobs).is_dir():
            data.setdefault("blobs", run.blobs)
    return build(MetricsConfig, data, path="metrics")


def _run_id(run_dir: Path) -> str:
    """The run id `dart up` recorded (run.json, else summary.json), else the directory's name."""
    for name in ("run.json", "summary.json"):
        with contextlib.suppress(OSError, ValueError):
            return str(json.loads((run_dir / name).read_text())["run_id"])
    return run_dir.resolve().name


def cmd_metrics(args: argparse.Namespace) -> int:
    run = run_of(args)
    if run is not None and not run.log.is_dir():
        raise RunMissing(f"no archived log in {run.workdir} (no {run.log}): name the directory "
                         f"`dart up` ran in, e.g. runs/local")

    cfg = metrics_config(args, run)
    if run is not None:
        done = from_archive(log_dir_of(run.root), cfg)
        print(f"{done['records']} TensorBoard records from {done['events']} events in {cfg.out_dir} "
              f"(tensorboard --logdir {cfg.out_dir} --host 127.0.0.1)")
        return 0
    return run_live(cfg, bus_from_args(args))
