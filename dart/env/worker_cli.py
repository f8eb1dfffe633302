"""``dart env-worker [CONFIG] [flags]``: run environment slots for rollout requests.

CONFIG is a YAML file: its ``env:`` section is an :class:`~dart.env.worker.EnvWorkerConfig`
(``env.libvirt:`` the VM pool of ``--backend libvirt``, see deploy/libvirt/README.md), its
``bus:`` section the event log; flags override both, and dotted overrides (``env.slots=8``) the flags.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
from typing import Any

from dart.blobs import open_store
from dart.bus import ensure_topics
from dart.bus.cli import add_bus_args, bus_from_args
from dart.config import add_config_args, build, config_from_args, field_docs

_FLAGS = ("backend", "slots", "blobs", "worker_id", "run_id", "group", "reply_timeout_s", "max_attempts")


def register(sub: Any) -> None:
    # Deferred: loads libvirt and aiohttp, and every `dart` command imports this module.
    from dart.env.config import EnvWorkerConfig

    docs = field_docs(EnvWorkerConfig)
    p = sub.add_parser("env-worker", help="run environment slots (synthetic, a local X desktop or libvirt VMs) "
                                          "for rollout requests")
    add_config_args(p, what=" (its `env:` and `bus:` sections)")
    p.add_argument("--backend", choices=["synthetic", "xdesktop", "libvirt"], help=docs.get("backend"))
    p.add_argument("--slots", type=int, help=docs.get("slots"))
    p.add_argument("--blobs", help=docs.get("blobs"))
    p.add_argument("--worker-id", help=docs.get("worker_id"))
    p.add_argument("--run-id", help=docs.get("run_id"))
    p.add_argument("--group", help=docs.get("group"))
    p.add_argument("--reply-timeout-s", type=float, help=docs.get("reply_timeout_s"))
    p.add_argument("--max-attempts", type=int, help=docs.get("max_attempts"))
    p.add_argument("--task-files", action="append", metavar="PATH", help=docs.get("task_files"))
    add_bus_args(p, config=False)
    p.set_defaults(func=cmd_env_worker)


def worker_config_from_args(args: argparse.Namespace) -> Any:
    """The worker's config: YAML ``env:`` section, then flags, then dotted overrides."""
    # Deferred: loads libvirt and aiohttp, and every `dart` command imports this module.
    from dart.env.config import EnvWorkerConfig

    flags = {f"env.{flag}": getattr(args, flag, None) for flag in _FLAGS}
    flags["env.task_files"] = list(args.task_files) if getattr(args, "task_files", None) else None
    data = config_from_args(args, flags=flags)
    return build(EnvWorkerConfig, data.get("env") or {}, path="env")


def cmd_env_worker(args: argparse.Namespace) -> int:
    # Deferred: loads libvirt and aiohttp, and every `dart` command imports this module.
    from dart.env.worker import EnvWorker

    cfg = worker_config_from_args(args)
    bus = bus_from_args(args)
    ensure_topics(bus)
    worker = EnvWorker(cfg, bus, open_store(cfg.blobs))

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await worker.run(stop)

    asyncio.run(main())
    return 0
