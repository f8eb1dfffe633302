"""``dart model tiny``, ``dart serve``, ``dart rollout-worker``."""

from __future__ import annotations

import argparse
import asyncio
import signal
from typing import Any

from dart.agent.model import load_policy
from dart.agent.tiny import build_tiny
from dart.blobs import open_store
from dart.bus.cli import add_bus_args, bus_from_args
from dart.config import add_config_args, build, config_from_args, field_docs
from dart.rollout.config import RolloutWorkerConfig
from dart.rollout.hf_engine import HFEngine, HFEngineConfig


def register(sub: Any) -> None:
    p = sub.add_parser("model", help="policy checkpoints")
    msub = p.add_subparsers(dest="model_command", metavar="WHAT")
    msub.required = True
    t = msub.add_parser("tiny", help="build a tiny random Qwen2.5-VL (about 0.4 M params) for CPU tests")
    t.add_argument("out_dir", help="directory to write (save_pretrained layout)")
    t.add_argument("--seed", type=int, default=0, help="weight seed; the same seed gives the same bytes")
    t.set_defaults(func=cmd_model_tiny)

    p = sub.add_parser("serve", help="serve a policy as an OpenAI-compatible chat-completions endpoint")
    p.add_argument("--model", required=True, help="model directory (save_pretrained layout)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default loopback only)")
    p.add_argument("--port", type=int, default=8000, help="port to bind (default %(default)s)")
    p.add_argument("--device", default="cpu", help="torch device of the model (default %(default)s)")
    p.add_argument("--name", default="policy", help="model name reported to clients")
    p.add_argument("--max-batch-size", type=int, default=8,
                   help="most requests generated together (default %(default)s)")
    p.set_defaults(func=cmd_serve)

    docs = field_docs(RolloutWorkerConfig)
    p = sub.add_parser("rollout-worker", help="answer observations with a policy; follow weight versions")
    add_config_args(p, what=" (its `rollout:` and `bus:` sections)")
    p.add_argument("--model", help=docs.get("model"))
    p.add_argument("--engine", choices=["hf", "openai", "vllm"], help=docs.get("engine"))
    p.add_argument("--device", help=docs.get("device"))
    p.add_argument("--blobs", help=docs.get("blobs"))
    p.add_argument("--worker-id", help=docs.get("worker_id"))
    p.add_argument("--run-id", help=docs.get("run_id"))
    p.add_argument("--max-concurrency", type=int, help=docs.get("max_concurrency"))
    add_bus_args(p, config=False)
    p.set_defaults(func=cmd_rollout_worker)


def cmd_model_tiny(args: argparse.Namespace) -> int:
    out = build_tiny(args.out_dir, seed=args.seed)
    print(f"tiny Qwen2.5-VL (seed {args.seed}) written to {out}")
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    # Deferred: loads aiohttp, and every `dart` command imports this module.
    from dart.rollout.server import make_app, start_server

    policy = load_policy(args.model, args.device)
    engine = HFEngine(policy, HFEngineConfig(max_batch_size=args.max_batch_size))
    app = make_app(engine, model_name=args.name, tokenizer=policy.tokenizer)

    async def main() -> None:
        site, port = await start_server(app, args.host, args.port)
        print(f"dart serve: http://{args.host}:{port}/v1 ({args.model})", flush=True)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        try:
            await stop.wait()
        finally:
            await site.stop()

    asyncio.run(main())
    return 0


def worker_config_from_args(args: argparse.Namespace) -> Any:
    flags = {f"rollout.{flag}": getattr(args, flag, None)
             for flag in ("model", "engine", "device", "blobs", "worker_id", "run_id", "max_concurrency")}
    data = config_from_args(args, flags=flags)
    return build(RolloutWorkerConfig, data.get("rollout") or {}, path="rollout")


def cmd_rollout_worker(args: argparse.Namespace) -> int:
    # Deferred: loads torch, and every `dart` command imports this module.
    from dart.rollout.service import RolloutWorker, make_engine

    cfg = worker_config_from_args(args)
    bus = bus_from_args(args)
    worker = RolloutWorker(cfg, make_engine(cfg), open_store(cfg.blobs), bus)

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await worker.run(stop)

    asyncio.run(main())
    return 0
