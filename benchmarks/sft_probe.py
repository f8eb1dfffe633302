"""What a warm start learns, step by step: SFT on a preset's oracle demonstrations (the maths of
``dart.recipe.warmstart``), and every ``--every`` steps the greedy policy's first click on held-out
tasks, right or wrong per instruction word (does it read the colour?), and its held-out episode
success. The checks of ``warm_start`` only see episode success, which on the ``chain`` preset
hides the click: a greedy policy that misses a page clicks the same wrong button for ever.

    .venv/bin/python benchmarks/sft_probe.py --config configs/chain.yaml [--lr 1e-3 --micro-batch 8]
        [--steps 3000 --every 250 --clicks 200 --episodes 60 --seed 0 --threads 2]

Measured 2026-11-26 on this 2-core machine (chain, seed 0, ~5 min a run): at make run's SFT
settings (``--lr 1e-3 --micro-batch 8``) the first click stayed at chance, right on 0.19-0.41 of
first pages at every check to step 3,000 (one colour at a time rising and falling; episode success
0.00-0.22); at chain.yaml's 3e-4 and 16 samples it was right on 0.64 at step 2,000, every colour
above chance (blue 0.50, green 0.56, red 0.87, yellow 0.69), episode success 0.32. A close look
at seed 1 (``--seed 1 --steps 2300 --every 50 --start 1700 --threads 1``, the warm start's own
thread count, so the same weights as `dart up`'s SFT): episode success 0.00-0.04 to step 2,000,
then 0.24, 0.41, 0.62, 0.87 at 2,050-2,200, which is why the chain warm start checks every 50
steps once success leaves zero (``sft_fine_check_every``).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import dataclasses
import random
import tempfile
import time
from pathlib import Path

import torch
import yaml

from dart.agent.decide import EngineActor
from dart.agent.model import Policy, load_policy
from dart.agent.prompt import blob_image_loader
from dart.agent.tiny import build_tiny
from dart.blobs import BlobStore, LocalBlobStore
from dart.config import build
from dart.env.episode import Episode
from dart.env.synthetic import SyntheticBackend
from dart.events import Sampling
from dart.recipe.config import make_tasks
from dart.recipe.episodes import evaluate
from dart.recipe.warmstart import demo_tasks, manifest_of, oracle_samples
from dart.rollout.hf_engine import HFEngine, HFEngineConfig
from dart.stack.config import StackConfig
from dart.train.batch import prepare_samples
from dart.train.config import EngineConfig, OptimConfig
from dart.train.engine import TorchEngine
from dart.train.sft import sft_loop


class _Watched(SyntheticBackend):
    """The synthetic backend, keeping the info of its latest step (which page the click turned to)."""

    info: dict = {}  # noqa: RUF012 (replaced, never mutated)

    async def step(self, action):  # type: ignore[no-untyped-def]
        obs = await super().step(action)
        self.info = obs.info
        return obs


async def first_clicks(policy: Policy, tasks: list[dict], store: BlobStore, cfg: StackConfig) -> list[bool]:
    """Per task: does the greedy first answer turn the first page (or finish the task)? One step
    of the episode loop (:class:`dart.env.episode.Episode`) with the greedy policy as its actor."""
    engine = HFEngine(policy, HFEngineConfig(max_batch_size=64))
    greedy = Sampling(temperature=0.0, top_p=1.0, max_new_tokens=cfg.data.scheduler.max_new_tokens, seed=1)

    async def one(task: dict) -> bool:
        backend = _Watched()
        actor = EngineActor(engine, load_image=blob_image_loader(store), prompt=cfg.rollout.prompt,
                            convention=cfg.rollout.convention, sampling=lambda _: greedy)
        try:
            await Episode(task=task, instruction=task["instruction"], backend=backend, max_steps=1).run(
                actor, store=store)
        finally:
            await backend.close()
        return backend.info.get("page") == 1 or bool(backend.info.get("done"))

    try:
        return list(await asyncio.gather(*(one(t) for t in tasks)))
    finally:
        await engine.close()


def word_of(instruction: str, words: set[str]) -> str:
    return next((w for w in instruction.lower().replace(".", " ").split() if w in words), "other")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", type=Path, default=Path("configs/chain.yaml"))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--lr", type=float, default=None, help="SFT learning rate (default: the config's)")
    ap.add_argument("--micro-batch", type=int, default=None, help="samples per SFT step (default: the config's)")
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--every", type=int, default=250)
    ap.add_argument("--start", type=int, default=0, help="no checks before this step (a close look at a transition)")
    ap.add_argument("--clicks", type=int, default=200, help="held-out first pages per check")
    ap.add_argument("--episodes", type=int, default=60, help="held-out greedy episodes per check")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from dart.env.synthetic.generator import COLORS

    cfg = build(StackConfig, yaml.safe_load(args.config.read_text()))
    recipe = dataclasses.replace(cfg.recipe, seed=args.seed, sft_lr=args.lr or cfg.recipe.sft_lr,
                                 sft_micro_batch=args.micro_batch or cfg.recipe.sft_micro_batch)
    cfg = dataclasses.replace(cfg, recipe=recipe)
    print(f"{args.config} seed {args.seed}: SFT lr {recipe.sft_lr}, {recipe.sft_micro_batch} samples a step", flush=True)
    train, held = make_tasks(recipe)
    with tempfile.TemporaryDirectory() as tmp:
        store = LocalBlobStore(Path(tmp) / "blobs")
        policy = load_policy(build_tiny(Path(tmp) / "init", seed=recipe.seed, size=recipe.model))
        demos = oracle_samples(demo_tasks(train, recipe), policy, store, cfg)
        kept, _ = prepare_samples(manifest_of(demos, 0), tokenizer=policy.tokenizer, image_processor=policy.image_processor,
                                  load_image=blob_image_loader(store), prompt_cfg=cfg.rollout.prompt, check_hash=True,
                                  advantages=False)
        engine = TorchEngine(policy.model, OptimConfig(lr=recipe.sft_lr, weight_decay=0.0),
                             EngineConfig(device="cpu", threads=args.threads))
        probe = held[: args.clicks]
        words = set(COLORS)
        t0, losses = time.perf_counter(), []
        taken = sft_loop(engine, kept, policy.pad_token_id, micro_batch=recipe.sft_micro_batch, steps=args.steps,
                         rng=random.Random(recipe.seed), whole_only=True)
        for step, (_, loss) in enumerate(taken, start=1):
            losses.append(loss)
            if (step >= args.start and step % args.every == 0) or step == args.steps:
                policy.model.eval()
                right = asyncio.run(first_clicks(policy, probe, store, cfg))
                success = evaluate(policy, held, args.episodes, store=store, cfg=cfg, phase=-step)
                policy.model.train()
                by = collections.defaultdict(list)
                for task, ok in zip(probe, right, strict=True):
                    by[word_of(task["instruction"], words)].append(ok)
                per_word = " ".join(f"{w} {sum(v) / len(v):.2f}" for w, v in sorted(by.items()))
                print(f"step {step} ({time.perf_counter() - t0:.0f} s): nll {sum(losses) / len(losses):.3f}, "
                      f"first click right {sum(right) / len(right):.2f} ({per_word}), "
                      f"held-out episode success {success:.2f}", flush=True)
                losses = []


if __name__ == "__main__":
    main()
