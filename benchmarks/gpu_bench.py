"""GPU benchmark: dart's trainer at Qwen2.5-VL's 1.5B and 7B shapes, text-only and with one
screenshot per step; the bfloat16 update check; a 7B version's publish-to-serve path beside the
host's own copy and disk limits. One JSON of figures.

    deploy/gpu/smoke.sh                                     # runs it on a CUDA host (BENCH=0 leaves it out)
    PYTHONPATH=$PWD python benchmarks/gpu_bench.py [--out FILE] [--budget-s 330] [--engine-set KEY=VALUE ...]
    PYTHONPATH=$PWD python benchmarks/gpu_bench.py --tiny  # tiny shapes on the CPU: the steps, no figures to quote

No network and the host's own torch and transformers: random weights from a config
(``Qwen2_5_VLForConditionalGeneration``, SDPA attention), dart's ``build_engine``, ``apply_update``
(``policy_loss``, the KL reference) and the weight path (``HostStaging`` -> ``commit_checkpoint``
/``write_weights`` -> ``put_weights`` -> ``get_buffer`` into pinned memory -> ``load_state_dict``).

- ``train``: per shape and input, one warm-up update and ``--updates`` timed ones of ``--steps``
  samples x ``--seq`` tokens (``--response`` of them response); tokens/s, MFU = 6·N·T / (s x
  989e12) with N the language model's parameters (the H200's dense bf16 peak), peak GiB.
  A screenshot step holds one 1288x728 image (1,196 of its tokens), gradient checkpointing on.
- ``bf16_check``: the share of elements of a q_proj, a down_proj and an RMSNorm weight that one
  update at lr 1e-6 changed (a plain bf16 AdamW step rounds most of them away); with
  ``--engine-set`` the same update again under those engine/optimiser settings (e.g. what keeps
  fp32 master weights), as before/after.
- ``publish``: a 7B version from the trainer's GPU to the reference model's GPU through the blob
  path, stage by stage, and the limits of the same bytes: GPU to pinned / pageable host memory,
  pinned to GPU, one write + fsync, one core's sha256 (of the first 2 GiB, scaled to every byte).

``--budget-s``: parts that would start after it are left out (said so in the JSON), so a slow
host still finishes inside the smoke's time.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import hashlib
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from dart.agent.weight_format import state_dict_from_buffer, write_weights  # noqa: E402
from dart.blobs import LocalBlobStore  # noqa: E402
from dart.rollout.weight_swap import HostBuffer  # noqa: E402
from dart.train.batch import ModelBatch  # noqa: E402
from dart.train.checkpoint import TrainState, commit_checkpoint  # noqa: E402
from dart.train.config import EngineConfig, OptimConfig  # noqa: E402
from dart.train.engine import ReferencePolicy, build_engine  # noqa: E402
from dart.train.loss import LossConfig  # noqa: E402
from dart.train.staging import HostStaging  # noqa: E402
from dart.train.update import apply_update  # noqa: E402

PEAK_FLOPS = 989e12
"""The H200's (and H100 SXM's) dense bfloat16 peak: the MFU denominator."""
IDS = {"image_token_id": 151655, "video_token_id": 151656, "vision_start_token_id": 151652,
       "vision_end_token_id": 151653}
VISION_7B = {"depth": 32, "hidden_size": 1280, "intermediate_size": 3420, "num_heads": 16, "patch_size": 14,
             "spatial_merge_size": 2, "temporal_patch_size": 2, "window_size": 112,
             "fullatt_block_indexes": [7, 15, 23, 31]}
SHAPES: dict[str, dict[str, Any]] = {
    # Qwen2.5-VL-7B (= UI-TARS-1.5-7B): 8.29 B parameters, 7.62 B of them the language model
    "7b": {"text": {"vocab_size": 152064, "hidden_size": 3584, "intermediate_size": 18944, "num_hidden_layers": 28,
                    "num_attention_heads": 28, "num_key_value_heads": 4}, "vision": VISION_7B, "tie": False},
    # Qwen2.5-1.5B's language model with the same vision tower: 2.21 B
    "1.5b": {"text": {"vocab_size": 151936, "hidden_size": 1536, "intermediate_size": 8960, "num_hidden_layers": 28,
                      "num_attention_heads": 12, "num_key_value_heads": 2}, "vision": VISION_7B, "tie": True},
    "tiny": {"text": {"vocab_size": 1024, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
                      "num_attention_heads": 4, "num_key_value_heads": 2},
             "vision": {**VISION_7B, "depth": 2, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2,
                        "fullatt_block_indexes": [1]}, "tie": False,
             "ids": {"image_token_id": 1000, "video_token_id": 1001, "vision_start_token_id": 1002,
                     "vision_end_token_id": 1003}},
}
SCREEN = (1288, 728)
"""A screenshot's width and height: 92 x 52 patches of 14, 1,196 tokens after the 2 x 2 merge."""


def build_model(shape: str, device: torch.device) -> torch.nn.Module:
    """A randomly initialised Qwen2.5-VL of ``shape``, made on ``device`` in bfloat16 (no CPU copy)."""
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    spec = SHAPES[shape]
    head = spec["text"]["hidden_size"] // spec["text"]["num_attention_heads"]
    half = head // 2
    t = half // 4
    pad = min(151643, spec["text"]["vocab_size"] - 1)            # Qwen's <|endoftext|>
    config = Qwen2_5_VLConfig(
        text_config={**spec["text"], "max_position_embeddings": 32768, "pad_token_id": pad, "bos_token_id": pad,
                     "eos_token_id": pad,
                     "rope_parameters": {"rope_type": "default", "rope_theta": 1e6,
                                         "mrope_section": [t, (half - t) // 2, half - t - (half - t) // 2]}},
        vision_config={**spec["vision"], "out_hidden_size": spec["text"]["hidden_size"]},
        tie_word_embeddings=spec["tie"], **spec.get("ids", IDS))
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    with device:
        model = Qwen2_5_VLForConditionalGeneration._from_config(config, dtype=torch.bfloat16)
    return model


def language_params(model: torch.nn.Module) -> int:
    """N of 6·N·T: every parameter outside the vision tower (the LM head counted once if tied)."""
    visual = {id(p) for name, p in model.named_parameters() if ".visual." in f".{name}"}
    return sum(p.numel() for p in model.parameters() if id(p) not in visual)


def sample_batch(shape: str, n: int, seq: int, response: int, screen: tuple[int, int] | None,
                 gen: torch.Generator) -> ModelBatch:
    """``n`` samples of ``seq`` tokens, the last ``response`` the response; with ``screen``, one
    screenshot of that size at the start of each (random pixels)."""
    special = SHAPES[shape].get("ids", IDS)
    ids = torch.randint(0, min(special.values()) - 1, (n, seq), generator=gen)
    types = torch.zeros(n, seq, dtype=torch.int32)
    pixels = grid = None
    if screen is not None:
        gw, gh = screen[0] // 14, screen[1] // 14
        tokens = gw * gh // 4
        ids[:, 0] = special["vision_start_token_id"]
        ids[:, 1:1 + tokens] = special["image_token_id"]
        ids[:, 1 + tokens] = special["vision_end_token_id"]
        types[:, 1:1 + tokens] = 1
        pixels = torch.randn(n * gw * gh, 3 * 2 * 14 * 14, generator=gen)
        grid = torch.tensor([[1, gh, gw]] * n)
    prompt = seq - response
    return ModelBatch(
        input_ids_B_L=ids, attention_mask_B_L=torch.ones(n, seq, dtype=torch.long), mm_token_type_ids_B_L=types,
        pixel_values=pixels, image_grid_thw=grid, response_token_ids_B_T=ids[:, prompt:],
        logit_pos_B_T=torch.arange(prompt - 1, seq - 1).expand(n, -1).contiguous(),
        mask_B_T=torch.ones(n, response), rollout_logprobs_B_T=-torch.rand(n, response, generator=gen),
        entropy_B_T=torch.rand(n, response, generator=gen), adv_B=torch.randn(n, generator=gen).sign(),
        sft_B=torch.zeros(n, dtype=torch.bool), step_mask_B=torch.ones(n, dtype=torch.bool))


def configs(args: argparse.Namespace, micro: int, checkpointing: bool, device: torch.device,
            sets: dict[str, str] | None = None) -> tuple[OptimConfig, EngineConfig, list[str]]:
    """The engine and optimiser configs, with ``--engine-set`` applied where a field exists."""
    optim = OptimConfig(lr=1e-6)
    engine = EngineConfig(device=device.type, dtype="bfloat16", micro_batch_samples=micro,
                          gradient_checkpointing=checkpointing)
    ignored = []
    for key, raw in (sets or {}).items():
        target = next((c for c in (engine, optim) if key in {f.name for f in dataclasses.fields(c)}), None)
        if target is None:
            ignored.append(key)          # a setting this checkout does not have yet
            continue
        value: Any = json.loads(raw) if raw[:1] in "[{0123456789-tf" and raw not in ("-",) else raw
        if target is engine:
            engine = dataclasses.replace(engine, **{key: value})
        else:
            optim = dataclasses.replace(optim, **{key: value})
    return optim, engine, ignored


def batches_of(args: argparse.Namespace, shape: str, steps: int, micro: int, screen: tuple[int, int] | None,
               gen: torch.Generator) -> list[ModelBatch]:
    return [sample_batch(shape, min(micro, steps - i), args.seq, args.response, screen, gen)
            for i in range(0, steps, micro)]


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def timed_updates(engine: Any, ref: Any, batches: list[ModelBatch], updates: int, device: torch.device) -> list[float]:
    loss = LossConfig()
    out = []
    for _ in range(updates):
        sync(device)
        t0 = time.perf_counter()
        apply_update(engine, batches, loss, ref)
        sync(device)
        out.append(time.perf_counter() - t0)
    return out


WATCHED = ("layers.0.self_attn.q_proj.weight", "layers.0.mlp.down_proj.weight", "layers.0.input_layernorm.weight")
"""A linear layer of attention, one of the MLP, and an RMSNorm weight (0 % changed before)."""


def watched(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Copies of the watched language-model tensors (not the vision tower's)."""
    params = {n: p for n, p in model.named_parameters() if ".visual." not in f".{n}"}
    return {n: params[n].detach().clone() for suffix in WATCHED for n in params if n.endswith(suffix)}


def changed_share(before: dict[str, torch.Tensor], model: torch.nn.Module) -> dict[str, float]:
    """Share of each watched tensor's elements that differ from ``before``."""
    now = dict(model.named_parameters())
    return {name.split("layers.0.", 1)[-1]: round(float((now[name].detach() != old).float().mean()), 5)
            for name, old in before.items()}


def train_shape(args: argparse.Namespace, shape: str, device: torch.device, fig: dict[str, Any],
                deadline: float) -> tuple[Any, Any]:
    """Text-only then screenshot updates at one shape, with the bf16 check on the first update;
    returns (engine, reference) for the publish part."""
    model = build_model(shape, device)
    n_lm, n_all = language_params(model), sum(p.numel() for p in model.parameters())
    ref_model = copy.deepcopy(model)
    optim, engine_cfg, _ = configs(args, args.micro, False, device)
    engine = build_engine(model, optim, engine_cfg)
    ref = ReferencePolicy(ref_model, engine.device, torch.bfloat16)
    gen = torch.Generator().manual_seed(0)
    out: dict[str, Any] = {"params": n_all, "language_params": n_lm}
    for name, screen, micro, ckpt in (("text", None, args.micro, False), ("screenshot", args.screen, args.micro_image, True)):
        if time.perf_counter() > deadline:
            out[name] = {"left_out": "past --budget-s"}
            continue
        steps = args.steps if screen is None else args.image_steps
        batches = batches_of(args, shape, steps, micro, screen, gen)
        if ckpt:
            engine.policy.gradient_checkpointing_enable()
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
        before = watched(engine.policy) if name == "text" else None
        warm = timed_updates(engine, ref, batches, 1, device)
        if before is not None:
            fig.setdefault("bf16_check", {})[shape] = {"lr": optim.lr, "changed": changed_share(before, engine.policy)}
        seconds = timed_updates(engine, ref, batches, args.updates, device)
        tokens = steps * args.seq
        s = sorted(seconds)[len(seconds) // 2]
        out[name] = {"steps": steps, "seq": args.seq, "micro": micro, "gradient_checkpointing": ckpt,
                     "warmup_s": round(warm[0], 3), "update_s": [round(x, 3) for x in seconds],
                     "tokens_per_s": round(tokens / s, 1), "mfu": round(6 * n_lm * tokens / s / PEAK_FLOPS, 4),
                     "peak_gib": round(torch.cuda.max_memory_allocated() / 2**30, 1) if device.type == "cuda" else None}
        if ckpt:
            engine.policy.gradient_checkpointing_disable()
    fig.setdefault("train", {})[shape] = out
    return engine, ref


def bf16_after(args: argparse.Namespace, shape: str, device: torch.device, fig: dict[str, Any]) -> None:
    """The bf16 check again under ``--engine-set`` (a fresh model: the same start as the plain one)."""
    optim, engine_cfg, ignored = configs(args, args.micro, False, device, dict(args.engine_set))
    model = build_model(shape, device)
    ref = ReferencePolicy(copy.deepcopy(model), device, torch.bfloat16)
    engine = build_engine(model, optim, engine_cfg)
    before = watched(engine.policy)
    # the batches of the plain run's first update: the same start, the same data
    timed_updates(engine, ref, batches_of(args, shape, args.steps, args.micro, None, torch.Generator().manual_seed(0)),
                  1, device)
    fig["bf16_check"][f"{shape} with {dict(args.engine_set)}"] = {"changed": changed_share(before, engine.policy),
                                                                  "ignored_settings": ignored}


def seconds_of(fn: Any, device: torch.device) -> tuple[float, Any]:
    sync(device)
    t0 = time.perf_counter()
    out = fn()
    sync(device)
    return time.perf_counter() - t0, out


def publish(engine: Any, ref: Any, work: Path, device: torch.device) -> dict[str, Any]:
    """One version from the trainer's weights to the reference model's, stage by stage, and the
    limits of the same bytes on this host."""
    from dart.train.weight_publish import put_weights

    staging = HostStaging()
    staging.copy(engine.policy.state_dict())                      # made once by the trainer: not timed
    store = LocalBlobStore(work / "blobs")
    host_buf = HostBuffer(pin=device.type == "cuda")
    stages: dict[str, float] = {}
    stages["host"], host = seconds_of(lambda: engine.full_state_dict(staging), device)
    nbytes = sum(t.numel() * t.element_size() for t in host.values())

    def write(directory: Path) -> None:
        write_weights(host, "{}", directory)

    stages["commit"], ckpt = seconds_of(lambda: commit_checkpoint(work / "ckpt", TrainState(step=1), write, keep=1),
                                        device)
    stages["publish"], refs = seconds_of(lambda: put_weights(store, ckpt, link=True), device)
    host_buf.alloc(refs[0].size_bytes)                            # the worker's buffer, made once: not timed
    stages["fetch"], fetched = seconds_of(
        lambda: state_dict_from_buffer(store.get_buffer(refs[0].digest, host_buf.alloc)), device)
    target = ref.scorer.policy
    stages["load"], _ = seconds_of(lambda: target.load_state_dict(fetched, strict=True), device)
    stages["total"] = sum(stages.values())
    out: dict[str, Any] = {"bytes": nbytes, "stages_s": {k: round(v, 3) for k, v in stages.items()},
                           "stages_gb_per_s": {k: round(nbytes / v / 1e9, 2) for k, v in stages.items() if v > 0}}
    out["limits_s"] = limits(engine, staging, host, work, device)
    return out


def limits(engine: Any, staging: HostStaging, host: dict[str, torch.Tensor], work: Path,
           device: torch.device) -> dict[str, float | None]:
    """The same bytes through the host's plain copies, one write + fsync and one core's sha256."""
    params = engine.policy.state_dict()
    got: dict[str, float | None] = {}
    got["device_to_pinned"] = seconds_of(lambda: staging.copy(params), device)[0] if staging.pin else None
    got["device_to_pageable"] = seconds_of(
        lambda: {k: v.detach().to("cpu") for k, v in params.items()}, device)[0]
    if device.type == "cuda":
        got["pinned_to_device"] = seconds_of(
            lambda: [params[k].copy_(v, non_blocking=True) for k, v in host.items()], device)[0]
    views = [t.reshape(-1).view(torch.uint8).numpy() for t in host.values() if t.numel()]
    path = work / "write.bin"

    def write_fsync() -> None:
        with open(path, "wb", buffering=0) as fh:
            for v in views:
                fh.write(memoryview(v))
            os.fsync(fh.fileno())

    got["write_fsync"] = seconds_of(write_fsync, device)[0]
    path.unlink()

    def sha256() -> int:
        h, done = hashlib.sha256(), 0
        for v in views:
            if done >= 2 << 30:          # 2 GiB tell the rate; all 16.6 GB would cost ~13 s of the budget
                break
            h.update(memoryview(v))
            done += v.nbytes
        return done

    hashed_s, hashed = seconds_of(sha256, device)
    got["sha256_one_core"] = hashed_s * sum(v.nbytes for v in views) / max(hashed, 1)   # scaled to every byte
    return {k: None if v is None else round(v, 3) for k, v in got.items()}


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tiny", action="store_true", help="tiny shapes on the CPU: the steps, no figures to quote")
    ap.add_argument("--shapes", default=None, help="comma-separated, of 1.5b, 7b (default both; --tiny: tiny)")
    ap.add_argument("--publish-shape", default=None, help="the shape whose version is published (default 7b)")
    ap.add_argument("--steps", type=int, default=32, help="samples per text update")
    ap.add_argument("--image-steps", type=int, default=8, help="samples per screenshot update")
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--response", type=int, default=128)
    ap.add_argument("--micro", type=int, default=2, help="micro-batch of text updates")
    ap.add_argument("--micro-image", type=int, default=4, help="micro-batch of screenshot updates")
    ap.add_argument("--updates", type=int, default=2, help="timed updates after one warm-up")
    ap.add_argument("--budget-s", type=float, default=330.0)
    ap.add_argument("--engine-set", action="append", default=[], type=lambda kv: tuple(kv.split("=", 1)),
                    metavar="KEY=VALUE", help="an EngineConfig/OptimConfig field for the bf16 check's 'after' run")
    ap.add_argument("--workdir", type=Path, default=None, help="where the version's files go (default: a temp dir)")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    args.screen = SCREEN
    if args.tiny:
        args.shapes = args.shapes or "tiny"
        args.publish_shape = args.publish_shape or "tiny"
        args.steps, args.image_steps, args.seq, args.response, args.updates = 2, 2, 64, 8, 1
        args.screen = (56, 56)
    args.shapes = (args.shapes or "1.5b,7b").split(",")
    args.publish_shape = args.publish_shape or "7b"
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if not args.tiny and not torch.cuda.is_available():
        print("gpu bench: no CUDA device is visible to torch: nothing measured (--tiny runs the steps on the CPU)")
        return 3
    device = torch.device("cpu" if args.tiny else "cuda")
    start = time.perf_counter()
    deadline = start + args.budget_s
    fig: dict[str, Any] = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "host": platform.node(),
                           "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
                           "torch": torch.__version__, "tiny": args.tiny, "left_out": []}
    work = Path(tempfile.mkdtemp(prefix="gpu-bench-", dir=args.workdir))
    try:
        for shape in args.shapes:
            if time.perf_counter() > deadline:
                fig["left_out"].append(f"train {shape}: past --budget-s")
                continue
            engine, ref = train_shape(args, shape, device, fig, deadline)
            if shape == args.publish_shape:
                fig["publish"] = {shape: publish(engine, ref, work, device)}
            del engine, ref
            if device.type == "cuda":
                torch.cuda.empty_cache()
        if args.engine_set and time.perf_counter() < deadline:
            bf16_after(args, args.shapes[0], device, fig)
    finally:
        import shutil

        shutil.rmtree(work, ignore_errors=True)
    fig["wall_s"] = round(time.perf_counter() - start, 1)
    text = json.dumps(fig, indent=1)
    print(text)
    if args.out is not None:
        args.out.write_text(text + "\n")
    train = [f"{shape} {kind} {v[kind]['tokens_per_s']:,.0f} tok/s MFU {v[kind]['mfu']:.1%}"
             for shape, v in fig.get("train", {}).items() for kind in ("text", "screenshot") if "mfu" in v[kind]]
    served = [f"{shape} version served in {v['stages_s']['total']:.1f} s" for shape, v in fig.get("publish", {}).items()]
    print(f"gpu bench: done in {fig['wall_s']} s{' (tiny: no figures)' if args.tiny else ''}: "
          + "; ".join(train + served) + (f"; left out: {fig['left_out']}" if fig["left_out"] else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
