"""The ``dart`` command: one entry point, ``--help`` everywhere.

Exit status: 0 done, 1 a failure at run time (a missing broker, store, run directory or file,
a failed check), 2 a usage error (a wrong flag or argument, a config value that is not allowed),
130 interrupted. A failure dart expects is one line naming what is missing and the fix; ``-v``
adds the traceback.

Each package contributes its commands from ``dart/<package>/cli.py`` through
``register(subparsers)``; heavy imports (torch, transformers) happen inside the command
functions so ``dart --help`` stays fast.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from types import ModuleType

from dart import __version__
from dart.config import setup_logging
from dart.errors import ConfigError, DartError


def command_modules() -> list[ModuleType]:
    """Every package's command module, in the order ``dart --help`` lists them."""
    # Here, not at the top: `dart guest-agent` (what a VM runs) loads none of these (test_layout.py).
    from dart import demo, doctor
    from dart.bus import cli as bus_cli
    from dart.data import cli as data_cli
    from dart.env import cli as env_cli
    from dart.env import worker_cli
    from dart.env.libvirt import cli as libvirt_cli
    from dart.log import cli as log_cli
    from dart.metrics import cli as metrics_cli
    from dart.rollout import cli as rollout_cli
    from dart.stack import cli as stack_cli
    from dart.train import cli as train_cli

    return [bus_cli, doctor, demo, log_cli, env_cli, worker_cli, libvirt_cli, rollout_cli, data_cli, train_cli,
            stack_cli, metrics_cli]


def build_parser(*, only: Sequence[ModuleType] | None = None) -> argparse.ArgumentParser:
    """Every command, or only those of the ``only`` modules."""
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
    for module in command_modules() if only is None else only:
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["guest-agent"]:
        # What a VM runs: the agent's own modules only, not every service's (no Kafka, no torch).
        from dart.env.guest_agent import cli as agent_cli

        parser = build_parser(only=[agent_cli])
    else:
        parser = build_parser()
    args = parser.parse_args(argv)
    if args.log_format:
        os.environ["DART_LOG_FORMAT"] = args.log_format  # the processes it starts log the same way
    setup_logging(args.verbose, args.log_format, service=args.command)
    if os.environ.get("DART_METRICS_DIR") or os.environ.get("DART_METRICS_PORT"):
        # Deferred: loads the Kafka clients and fastavro, and every `dart` command imports this module.
        from dart.bus.prom import maybe_start_exporter

        maybe_start_exporter(args.command)  # a long-lived service: Prometheus /metrics
    try:
        if hasattr(args, "trust_run"):  # a command that reads a run (rundir.add_run_arg): opened and checked here
            # Deferred: the check loads chdb, which only commands that read a run need.
            from dart.data.storecheck import open_checked_run
            from dart.rundir import run_path  # here: what a VM runs (`dart guest-agent`) loads none of it

            path = run_path(args)
            args.run = None if path is None else open_checked_run(path, trust=args.trust_run)
        rc = args.func(args)
    except KeyboardInterrupt:
        return 130
    except Exception as exc:
        code = failure_code(exc)
        if code is None or args.verbose:
            raise  # a bug (or -v): the whole traceback
        sub = [str(v) for k, v in vars(args).items() if k.endswith("_command") and v]
        print(f"dart {' '.join([args.command, *sub])}: {exc}", file=sys.stderr)
        return code
    return int(rc or 0)


def failure_code(exc: BaseException) -> int | None:
    """The exit status of a failure dart expects (2 usage, 1 run time), None for anything else."""
    if isinstance(exc, ConfigError):
        return 2
    if isinstance(exc, DartError | OSError):  # missing files, refused connections, ToolMissing, ...
        return 1
    for cls in type(exc).__mro__:  # the Kafka and ClickHouse clients' own errors, without importing them
        if (cls.__module__.split(".")[0], cls.__name__) in EXPECTED_FOREIGN:
            return 1
    return None


EXPECTED_FOREIGN = {("aiokafka", "KafkaError"), ("confluent_kafka", "KafkaException"),
                    ("clickhouse_connect", "ClickHouseError")}
"""Errors of the clients dart drives that mean an unreachable or refusing server, not a bug."""


if __name__ == "__main__":
    sys.exit(main())
