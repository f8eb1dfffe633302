"""The ``dart`` command: one entry point, ``--help`` everywhere.

Each package contributes its commands from ``dart/<package>/cli.py`` through
``register(subparsers)``; heavy imports (torch, transformers) happen inside the command
functions so ``dart --help`` stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import sys
from collections.abc import Sequence

from dart import __version__
from dart.config import setup_logging
from dart.errors import DartError

COMMAND_MODULES = (
    "dart.bus.cli",
    "dart.log.cli",
    "dart.env.cli",
    "dart.env.worker_cli",
    "dart.env.libvirt.cli",
    "dart.rollout.cli",
    "dart.data.cli",
    "dart.train.cli",
    "dart.stack.cli",
    "dart.obs.cli",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dart",
        description="Decoupled, event-sourced multi-turn RL for GUI agents.",
    )
    parser.add_argument("--version", action="version", version=f"dart {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    parser.add_argument("--log-format", choices=("text", "json"),
                        help="log lines as text (the default) or one JSON object each, with service, worker id, "
                             "run id, rollout id and policy version where there are (also $DART_LOG_FORMAT; "
                             "the services `dart up` starts inherit it)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name in COMMAND_MODULES:
        try:
            if importlib.util.find_spec(name) is None:
                continue
        except ModuleNotFoundError:  # its package is not there (optional part not installed)
            continue
        importlib.import_module(name).register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.log_format:
        os.environ["DART_LOG_FORMAT"] = args.log_format  # the processes it starts log the same way
    setup_logging(args.verbose, args.log_format, service=args.command)
    if os.environ.get("DART_METRICS_DIR") or os.environ.get("DART_METRICS_PORT"):
        from dart.bus.prom import maybe_start_exporter

        maybe_start_exporter(args.command)  # a long-lived service: Prometheus /metrics
    try:
        rc = args.func(args)
    except DartError as exc:
        print(f"dart {args.command}: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return int(rc or 0)


if __name__ == "__main__":
    sys.exit(main())
