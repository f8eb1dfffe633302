"""``dart train CONFIG`` (the trainer service) and ``dart train --sft DATA`` (warm start)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
from pathlib import Path
from typing import Any

from dart.blobs import open_store
from dart.config import add_config_args, build, config_from_args
from dart.errors import ConfigError
from dart.train.weight_publish import put_weights, weights_published

log = logging.getLogger(__name__)


def register(sub: Any) -> None:
    p = sub.add_parser(
        "train", help="run the trainer (consume batches, update, publish weights), or warm-start with --sft",
        description="`dart train CONFIG` runs the trainer service from the file's `train:` section (bus from "
                    "its `bus:` section). `dart train --sft DATA --model DIR --out DIR` fine-tunes a policy "
                    "on experience trajectories (NLL on response tokens) and writes a policy directory.")
    add_config_args(p, what=": a `train:` section (TrainerConfig) and `bus:`")
    p.add_argument("--sft", metavar="DATA", type=Path,
                   help="warm start on a batch manifest or experience file (JSON list / lines of samples)")
    p.add_argument("--model", type=Path, help="policy directory to start from (overrides the config)")
    p.add_argument("--out", type=Path, help="--sft: policy directory to write")
    p.add_argument("--epochs", type=int, help="--sft: passes over the data (default 3)")
    p.add_argument("--lr", type=float, help="learning rate (overrides the config)")
    p.add_argument("--blobs", help="blob store directory (overrides the config)")
    p.add_argument("--publish", action="store_true", help="--sft: also publish the result as policy version 0")
    p.add_argument("--bootstrap", help="Kafka bootstrap host:port (default: $DART_BOOTSTRAP or 127.0.0.1:9092)")
    p.add_argument("--prefix", help="topic prefix (default: $DART_TOPIC_PREFIX or 'dart')")
    p.set_defaults(func=cmd_train)


def train_section(args: argparse.Namespace) -> dict[str, Any]:
    """The file's ``train:`` section (or the whole file, without ``bus:``), with the flags and then
    the dotted overrides (``train.optim.lr=1e-5``; ``optim.lr=...`` for a file without sections)
    laid over it."""
    sectioned = "train" in config_from_args(args)
    flags = {"model": args.model, "blobs": args.blobs, "optim.lr": args.lr}
    args.config_data = None  # read again, the flags under the overrides
    data = config_from_args(args, flags={(f"train.{k}" if sectioned else k): v for k, v in flags.items()})
    section = dict(data.get("train", data) or {})
    section.pop("bus", None)
    return section


def cmd_train(args: argparse.Namespace) -> int:
    # Deferred: loads the Kafka clients and fastavro, and every `dart` command imports this module.
    from dart.bus.cli import bus_from_args

    if args.sft is not None:
        return cmd_sft(args)
    section = train_section(args)
    if not args.config:
        raise ConfigError("give a CONFIG file (`dart train configs/train.yaml`) or --sft DATA for a warm start")
    # Deferred: loads torch, and every `dart` command imports this module.
    from dart.train.config import TrainerConfig
    from dart.train.trainer import TrainerHalted, serve

    cfg = build(TrainerConfig, section, path="train")
    # Deferred: loads torch, and every `dart` command imports this module.
    from dart.train import ranks

    if ranks.world()[1] > 1:  # one rank of several, under a launcher
        serve = ranks.serve_ranks
    elif cfg.ranks > 1:       # start the ranks: torchrun runs this command once per rank
        command = ranks.launch_command(cfg.ranks, launch_args(args))
        log.info("starting %d trainer ranks: %s", cfg.ranks, " ".join(command))
        os.execv(command[0], command)
    try:
        asyncio.run(serve(cfg, bus_from_args(args)))
    except TrainerHalted as exc:
        log.error("%s", exc)
        return 1
    return 0


def launch_args(args: argparse.Namespace) -> list[str]:
    """The arguments of this ``dart train CONFIG`` run again, for each rank."""
    out = [str(args.config), *(item for item in args.config_items if "=" in item)]
    for flag in ("model", "blobs", "lr", "bootstrap", "prefix"):
        if getattr(args, flag) is not None:
            out += [f"--{flag}", str(getattr(args, flag))]
    return out


def cmd_sft(args: argparse.Namespace) -> int:
    # Deferred: loads torch, and every `dart` command imports this module.
    from dart.train.sft import SFTConfig, run_sft

    section = train_section(args)
    data: dict[str, Any] = {"data": str(args.sft)}
    for name in ("model", "prompt", "engine", "seed"):
        if name in section:
            data[name] = section[name]
    if args.out is not None:
        data["out"] = str(args.out)
    if args.epochs is not None:
        data["epochs"] = args.epochs
    if args.lr is not None:
        data["optim"] = {"lr": args.lr, "weight_decay": 0.0}
    cfg = build(SFTConfig, data, path="sft")
    store = open_store(section.get("blobs", "./blobs"))
    result = run_sft(cfg, store)
    print(f"sft: {result.samples} samples, {len(result.dropped)} dropped, nll by epoch "
          f"{', '.join(f'{x:.4f}' for x in result.epoch_losses)}; policy written to {result.out}")
    if args.publish:
        asyncio.run(publish_initial(args, section, result.out, store))
    return 0


async def publish_initial(args: argparse.Namespace, section: dict[str, Any], out: Path, store: Any) -> None:
    # Deferred: loads the Kafka clients and fastavro, and every `dart` command imports this module.
    from dart.bus import Producer
    from dart.bus.cli import bus_from_args

    producer = Producer(bus_from_args(args), client_id=section.get("worker_id", "trainer-0"))
    try:
        event = weights_published(run_id=section.get("run_id", "dev"), producer=section.get("worker_id", "trainer-0"),
                                  version=0, blobs=put_weights(store, out), train_step=0, batch_id=None)
        await producer.send(event)
        print(f"sft: published {out} as policy version 0 ({event.sha256[:12]})")
    finally:
        producer.close()
