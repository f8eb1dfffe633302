"""Rollout-worker throughput: actions/s and engine busy fraction, micro-batched vs one at a time.

A closed-loop stream of observations: ``--slots`` env slots each send the next observation as
soon as the previous one is answered (like an env worker with instant environments). Each
answer takes the worker's real path: prompt from the blob store (history of ``--history``
turns), hf engine, UI-TARS parse. Both modes run in the same process on the same tiny model.

    .venv/bin/python benchmarks/rollout_throughput.py [--slots 16] [--actions 96] [--model DIR]

``--threads 2 1`` instead compares the micro-batched mode at those torch thread counts (the
rollout worker's ``hf.threads``), and ``--hog`` runs a busy loop on one core beside it (a
machine shared with the other services, as under `make run`).
"""

from __future__ import annotations

import argparse
import asyncio
import io
import tempfile
import time
from pathlib import Path

from dart.agent.model import load_policy
from dart.agent.prompt import PromptConfig, blob_image_loader, build_messages
from dart.agent.tiny import build_tiny
from dart.blobs import LocalBlobStore
from dart.events import HistoryTurn, ObservationEmitted, ReplyRoute, Sampling
from dart.events.manifest import PromptContext
from dart.rollout.config import RolloutWorkerConfig
from dart.rollout.engine import GenerateRequest
from dart.rollout.hf_engine import HFEngine, HFEngineConfig
from dart.rollout.service import actions_of


def screenshots(store: LocalBlobStore, n: int, size: tuple[int, int]) -> list[str]:
    from PIL import Image

    out = []
    for i in range(n):
        buf = io.BytesIO()
        Image.new("RGB", size, ((37 * i) % 256, (91 * i) % 256, (53 * i) % 256)).save(buf, "PNG")
        out.append(store.put(buf.getvalue()))
    return out


def observation(
    digests: list[str], step: int, seed: int, size: tuple[int, int], max_new: int
) -> ObservationEmitted:
    history = [
        HistoryTurn(
            step_index=i, screenshot_digest=digests[i], response_text="Thought: go on.\nAction: wait()"
        )
        for i in range(step)
    ]
    return ObservationEmitted.new(
        run_id="bench",
        producer="env",
        rollout_id=f"r{seed}",
        request_id="q",
        task_id="t",
        group_id="g",
        step_index=step,
        instruction="Open the settings and enable dark mode",
        screenshot_digest=digests[step],
        screen_width=size[0],
        screen_height=size[1],
        history=history,
        reply=ReplyRoute(topic="x", partition=0, worker_id="env"),
        sampling=Sampling(temperature=0.7, top_p=0.9, max_new_tokens=max_new, seed=seed),
        max_steps=30,
        env_worker="env",
        slot=0,
    )


async def run_mode(policy, store, digests, args, max_batch: int, threads: int = 0) -> dict[str, float]:
    cfg = RolloutWorkerConfig(
        model="bench", prompt=PromptConfig(min_pixels=args.min_pixels, max_pixels=args.max_pixels)
    )
    engine = HFEngine(policy, HFEngineConfig(max_batch_size=max_batch, threads=threads))
    load = blob_image_loader(store)
    answered = 0
    latencies: list[float] = []

    async def answer(obs: ObservationEmitted) -> None:
        nonlocal answered
        t0 = time.perf_counter()
        ctx = PromptContext.from_observation(obs)
        messages, images = await asyncio.to_thread(build_messages, ctx, load, cfg.prompt)
        gen = await engine.generate(GenerateRequest(messages=messages, images=images, sampling=obs.sampling))
        actions_of(gen.text, obs, cfg)
        latencies.append(time.perf_counter() - t0)
        answered += 1

    async def slot(k: int) -> None:
        i = 0
        while answered < args.actions:
            await answer(
                observation(
                    digests, args.history, seed=k * 100_000 + i, size=args.screen, max_new=args.max_new_tokens
                )
            )
            i += 1

    await engine.generate(
        GenerateRequest(
            messages=(
                m := build_messages(
                    PromptContext.from_observation(observation(digests, 0, 0, args.screen, 4)),
                    load,
                    cfg.prompt,
                )
            )[0],
            images=m[1],
            sampling=Sampling(temperature=1.0, top_p=1.0, max_new_tokens=4, seed=0),
        )
    )  # warm-up
    base = engine.stats()
    t0 = time.perf_counter()
    await asyncio.gather(*(slot(k) for k in range(args.slots)))
    wall = time.perf_counter() - t0
    stats = engine.stats()
    await engine.close()
    latencies.sort()
    batches = stats.batches - base.batches
    return {
        "actions": answered,
        "wall_s": wall,
        "actions_per_s": answered / wall,
        "busy_frac": (stats.busy_s - base.busy_s) / wall,
        "mean_batch": (stats.requests - base.requests) / max(1, batches),
        "p50_s": latencies[len(latencies) // 2],
        "p95_s": latencies[int(len(latencies) * 0.95) - 1],
    }


async def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", help="model directory (default: build the tiny model in a temp dir)")
    p.add_argument("--slots", type=int, default=16, help="concurrent env slots")
    p.add_argument("--actions", type=int, default=48, help="actions per mode")
    p.add_argument("--history", type=int, default=4, help="earlier turns in each prompt")
    p.add_argument("--max-new-tokens", type=int, default=24)
    p.add_argument("--max-batch", type=int, default=16, help="micro-batch size of the batched mode")
    p.add_argument("--screen", type=int, nargs=2, default=(320, 200))
    p.add_argument("--min-pixels", type=int, default=4 * 28 * 28)
    p.add_argument("--max-pixels", type=int, default=64 * 28 * 28)
    p.add_argument("--threads", type=int, nargs="+", help="compare the micro-batched mode at these torch thread counts")
    p.add_argument("--hog", action="store_true", help="a busy loop on one core beside the benchmark")
    args = p.parse_args()
    args.screen = tuple(args.screen)
    if args.threads:
        await compare_threads(args)
        return
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = Path(args.model) if args.model else build_tiny(Path(tmp) / "tiny", seed=0)
        policy = load_policy(model_dir)
        store = LocalBlobStore(Path(tmp) / "blobs")
        digests = screenshots(store, args.history + 1, args.screen)
        single = await run_mode(policy, store, digests, args, max_batch=1)
        batched = await run_mode(policy, store, digests, args, max_batch=args.max_batch)
    print(
        f"model {model_dir.name}, {args.slots} slots, {args.history} history turns, {args.max_new_tokens} new tokens"
    )
    print(f"{'mode':<16}{'actions/s':>10}{'busy':>7}{'batch':>7}{'p50 s':>8}{'p95 s':>8}")
    for name, r in (("one-at-a-time", single), (f"micro-batch<={args.max_batch}", batched)):
        print(
            f"{name:<16}{r['actions_per_s']:>10.2f}{r['busy_frac']:>7.0%}{r['mean_batch']:>7.1f}"
            f"{r['p50_s']:>8.2f}{r['p95_s']:>8.2f}"
        )
    print(
        f"micro-batched / one-at-a-time throughput: {batched['actions_per_s'] / single['actions_per_s']:.2f}x"
    )


async def compare_threads(args) -> None:
    import subprocess
    import sys

    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if args.hog else None
    try:
        with tempfile.TemporaryDirectory() as tmp:
            model_dir = Path(args.model) if args.model else build_tiny(Path(tmp) / "tiny", seed=0)
            policy = load_policy(model_dir)
            store = LocalBlobStore(Path(tmp) / "blobs")
            digests = screenshots(store, args.history + 1, args.screen)
            results = {n: await run_mode(policy, store, digests, args, max_batch=args.max_batch, threads=n)
                       for n in args.threads}
    finally:
        if hog is not None:
            hog.kill()
    print(f"model {model_dir.name}, {args.slots} slots, micro-batch<={args.max_batch}, "
          f"{'a busy loop on one core beside it' if args.hog else 'nothing beside it'}")
    print(f"{'threads':<10}{'actions/s':>10}{'busy':>7}{'batch':>7}{'p50 s':>8}")
    for n, r in results.items():
        print(f"{n:<10}{r['actions_per_s']:>10.2f}{r['busy_frac']:>7.0%}{r['mean_batch']:>7.1f}{r['p50_s']:>8.2f}")
    first = args.threads[0]
    for n in args.threads[1:]:
        print(f"{n} / {first} threads throughput: {results[n]['actions_per_s'] / results[first]['actions_per_s']:.2f}x")


if __name__ == "__main__":
    asyncio.run(main())
