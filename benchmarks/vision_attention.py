"""The vision tower's attention on screenshot steps: calls per update and CPU seconds.

A Qwen2.5-VL with UI-TARS-1.5-7B's vision layout (32 blocks, global attention in blocks 7, 15,
23 and 31, windows of 112 px, patch 14, spatial merge 2) at the tiny model's widths, one
1288x728 screenshot per step (1,196 of the step's 2,048 tokens), three ways:

- ``per_window``: transformers' ``sdpa`` path, one SDPA call per window (the baseline);
- ``packed``: :mod:`dart.agent.vision_attention`, one call per window length and layer;
- ``frozen``: packed, with the tower frozen (``trainer.freeze_vision``, :mod:`dart.train.freeze`).

1. **Calls per update**: dart's own update (``apply_update`` through ``TorchEngine`` with the KL
   reference, gradient checkpointing on, micro-batches of 4: the settings of the 7B GPU run) over
   ``--steps`` steps, counting the SDPA calls made inside the vision attention. How many calls a
   path makes depends neither on the numbers in the tensors nor on the tower's width, so here the
   tower is 8 wide and its SDPA a stand-in of the same shape (the value tensor): a CPU gets through
   32 full screenshots, and the update's CPU seconds are then mostly the cost of issuing the calls.
2. **CPU seconds**, sides interleaved pass by pass (process CPU seconds; wall seconds beside them;
   medians with min..max), real SDPA:
   - one windowed attention layer, transformers' own module (qkv, rotary, attention, proj) with
     UI-TARS-7B's head size (80; ``--layer-heads`` of its 16 heads), forward + backward;
   - the whole tower at the tiny width, forward + backward (frozen: the forward without autograd,
     all a frozen tower costs per pass).

    PYTHONPATH=$PWD .venv/bin/python benchmarks/vision_attention.py [--steps 32] [--passes 5] [--json OUT]
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import time
from collections.abc import Iterator
from pathlib import Path

import torch
import torch.nn.functional as F
from passes import Summary, interleave, pass_line, ratio, report

from dart.agent.vision_attention import register, use_packed_vision_attention
from dart.train.batch import ModelBatch
from dart.train.config import EngineConfig, OptimConfig
from dart.train.engine import ReferencePolicy, build_engine
from dart.train.freeze import freeze_vision_tower, vision_tower
from dart.train.loss import LossConfig
from dart.train.update import apply_update

GRID = (1, 52, 92)
"""A 1288x728 screenshot in 14-px patches (4,784 patches, 1,196 tokens after the 2x2 merge)."""
STEP_TOKENS, RESPONSE_TOKENS = 2048, 128
IMAGE_TOKEN, VISION_START, VISION_END = 250, 251, 252
SIDES = ("per_window", "packed", "frozen")
UITARS_7B_VISION = {"depth": 32, "fullatt_block_indexes": [7, 15, 23, 31], "window_size": 112, "patch_size": 14,
                    "spatial_merge_size": 2}
"""The vision layout of UI-TARS-1.5-7B (Qwen2.5-VL-7B's), less its widths (1280, 16 heads of 80)."""
SMALL_LM = {"vocab_size": 256, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
            "num_attention_heads": 4, "num_key_value_heads": 2, "bos_token_id": 0, "eos_token_id": 1,
            "pad_token_id": 0, "rope_parameters": {"rope_type": "default", "rope_theta": 1e6, "mrope_section": [2, 3, 3]}}


def model(width: int, heads: int) -> torch.nn.Module:
    """Random weights: UI-TARS-1.5-7B's vision layout at small widths, a two-layer language model."""
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    torch.manual_seed(0)
    vision = UITARS_7B_VISION | {"hidden_size": width, "intermediate_size": 2 * width, "num_heads": heads,
                                 "out_hidden_size": SMALL_LM["hidden_size"]}
    return Qwen2_5_VLForConditionalGeneration(Qwen2_5_VLConfig(
        text_config=SMALL_LM, vision_config=vision, image_token_id=IMAGE_TOKEN, vision_start_token_id=VISION_START,
        vision_end_token_id=VISION_END, video_token_id=253))


def select(policy: torch.nn.Module, side: str) -> torch.nn.Module:
    if side == "per_window":
        policy.set_attn_implementation({"vision_config": "sdpa"})
    else:
        use_packed_vision_attention(policy)
    return policy


def micro_batch(samples: int, seed: int) -> ModelBatch:
    """``samples`` screenshot steps: vision tokens, prompt text, a 128-token response."""
    g = torch.Generator().manual_seed(seed)
    image_tokens = GRID[1] * GRID[2] // 4
    prompt_len = STEP_TOKENS - RESPONSE_TOKENS
    text = torch.randint(2, 240, (samples, STEP_TOKENS), generator=g)
    text[:, 10] = VISION_START
    text[:, 11 : 11 + image_tokens] = IMAGE_TOKEN
    text[:, 11 + image_tokens] = VISION_END
    response = text[:, prompt_len:]
    return ModelBatch(
        input_ids_B_L=text, attention_mask_B_L=torch.ones_like(text),
        mm_token_type_ids_B_L=(text == IMAGE_TOKEN).int(),
        pixel_values=torch.randn(samples * GRID[0] * GRID[1] * GRID[2], 3 * 2 * 14 * 14, generator=g),
        image_grid_thw=torch.tensor([GRID] * samples),
        response_token_ids_B_T=response,
        logit_pos_B_T=(prompt_len - 1 + torch.arange(RESPONSE_TOKENS)).expand(samples, -1),
        mask_B_T=torch.ones(samples, RESPONSE_TOKENS), rollout_logprobs_B_T=torch.full((samples, RESPONSE_TOKENS), -5.5),
        entropy_B_T=torch.ones(samples, RESPONSE_TOKENS), adv_B=torch.linspace(-1, 1, samples),
        sft_B=torch.zeros(samples, dtype=torch.bool), step_mask_B=torch.ones(samples, dtype=torch.bool))


@contextlib.contextmanager
def vision_sdpa_counted(models: list[torch.nn.Module], *, stand_in: bool) -> Iterator[dict[str, int]]:
    """Counts SDPA calls inside the vision attention modules of ``models`` (and the rest apart);
    ``stand_in``: those calls return their value tensor instead of attending (same shape)."""
    from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VLVisionAttention

    counts = {"vision": 0, "other": 0}
    inside = [0]
    real = F.scaled_dot_product_attention

    def sdpa(query, key, value, *args, **kwargs):  # type: ignore[no-untyped-def]
        counts["vision" if inside[0] else "other"] += 1
        if inside[0] and stand_in:
            return value * 1.0
        return real(query, key, value, *args, **kwargs)

    hooks = []
    for m in models:
        for module in m.modules():
            if isinstance(module, Qwen2_5_VLVisionAttention):
                hooks.append(module.register_forward_pre_hook(lambda *_: inside.__setitem__(0, inside[0] + 1)))
                hooks.append(module.register_forward_hook(lambda *_: inside.__setitem__(0, inside[0] - 1)))
    F.scaled_dot_product_attention = sdpa
    try:
        yield counts
    finally:
        F.scaled_dot_product_attention = real
        for hook in hooks:
            hook.remove()


def calls_per_update(side: str, *, steps: int, micro: int, width: int, heads: int) -> dict[str, float]:
    """One update of ``steps`` screenshot steps through dart's engine; vision SDPA calls counted."""
    policy = select(model(width, heads), side)
    ref_model = copy.deepcopy(policy)
    if side == "frozen":
        freeze_vision_tower(policy)
    engine = build_engine(policy, OptimConfig(), EngineConfig(device="cpu", micro_batch_samples=micro,
                                                             gradient_checkpointing=True))
    ref = ReferencePolicy(ref_model, engine.device, torch.float32)
    batches = [micro_batch(min(micro, steps - i), seed=i) for i in range(0, steps, micro)]
    start, cpu0 = time.perf_counter(), time.process_time()
    with vision_sdpa_counted([policy, ref_model], stand_in=True) as counts:
        apply_update(engine, batches, LossConfig(), ref)
    return {"vision_sdpa_calls": counts["vision"], "text_sdpa_calls": counts["other"],
            "update_cpu_s_stand_in": round(time.process_time() - cpu0, 2),
            "update_wall_s_stand_in": round(time.perf_counter() - start, 2)}


def timed(sides: dict[str, object], passes: int, title: str) -> dict[str, object]:
    """Process CPU seconds of each side's ``run()``, interleaved; wall seconds beside them."""
    wall: dict[str, list[float]] = {side: [] for side in sides}

    def once(side: str) -> float:
        cpu0, wall0 = time.process_time(), time.perf_counter()
        sides[side]()  # type: ignore[operator]
        wall[side].append(time.perf_counter() - wall0)
        return time.process_time() - cpu0

    print(title, flush=True)
    cpu = interleave({side: (lambda _i, side=side: once(side)) for side in sides}, passes,
                     on_pass=pass_line("CPU s", ".3f"))
    print(report(cpu, "CPU s", ".3f"))
    out: dict[str, object] = {side: {"cpu_s": cpu[side].as_dict(3), "wall_s": Summary(tuple(wall[side])).as_dict(3)}
                              for side in sides}
    for side in list(sides)[1:]:
        out[f"ratio_per_window_over_{side}"] = round(ratio(cpu, "per_window", side), 2)
        print(f"per_window / {side}: {out[f'ratio_per_window_over_{side}']:.2f} (ratio of median CPU seconds)")
    return out


def layer_seconds(screens: int, passes: int, heads: int, head_dim: int) -> dict[str, object]:
    """One windowed vision attention layer (transformers' module: qkv, rotary, attention, proj) at
    UI-TARS-7B's head size, forward + backward over ``screens`` screenshots."""
    from transformers import Qwen2_5_VLVisionConfig
    from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VLVisionAttention
    from transformers.vision_utils import get_vision_window_index

    torch.manual_seed(0)
    config = Qwen2_5_VLVisionConfig(hidden_size=heads * head_dim, num_heads=heads)
    layer = Qwen2_5_VLVisionAttention(config)
    grid = torch.tensor([GRID] * screens)
    _, cu_windows = get_vision_window_index(grid, spatial_merge_size=2, window_size=112, patch_size=14)
    tokens = int(grid.prod(-1).sum())
    hidden = torch.randn(tokens, heads * head_dim, requires_grad=True)
    angles = torch.rand(tokens, head_dim) * 6.0
    rotary = (angles.cos(), angles.sin())

    def run(implementation: str) -> None:
        config._attn_implementation = implementation
        layer(hidden, cu_seqlens=cu_windows, position_embeddings=rotary).square().sum().backward()
        hidden.grad = None
        layer.zero_grad(set_to_none=True)

    return timed({"per_window": lambda: run("sdpa"), "packed": lambda: run(register())}, passes,
                 f"one windowed attention layer ({heads} heads x {head_dim}), {screens} screenshot(s), fwd+bwd:")


def tower_seconds(screens: int, passes: int, width: int, heads: int) -> dict[str, object]:
    """The whole vision tower's forward + backward (frozen: the forward without autograd)."""
    policy = model(width, heads).train()
    tower = vision_tower(policy)
    grid = torch.tensor([GRID] * screens)
    pixels = torch.randn(int(grid.prod(-1).sum()), 3 * 2 * 14 * 14, generator=torch.Generator().manual_seed(1))

    def run(side: str) -> None:
        select(policy, side)
        if side == "frozen":
            with torch.no_grad():
                tower(pixels, grid_thw=grid)
            return
        tower(pixels, grid_thw=grid).pooler_output.square().sum().backward()
        tower.zero_grad(set_to_none=True)

    return timed({side: (lambda side=side: run(side)) for side in SIDES}, passes,
                 f"the vision tower (32 blocks, width {width}), {screens} screenshot(s), fwd+bwd:")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=32, help="screenshot steps in the counted update")
    p.add_argument("--micro", type=int, default=4, help="samples per micro-batch")
    p.add_argument("--screens", type=int, default=1, help="screenshots per timed tower pass")
    p.add_argument("--passes", type=int, default=5)
    p.add_argument("--width", type=int, default=32, help="vision tower width (the tiny model's)")
    p.add_argument("--heads", type=int, default=2, help="vision tower heads (the tiny model's)")
    p.add_argument("--layer-heads", type=int, default=2,
                   help="heads of the timed attention layer (80 wide each, as in UI-TARS-7B's 16)")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (fixed: comparable passes)")
    p.add_argument("--json", type=Path, default=None, help="write the figures here")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    out: dict[str, object] = {"steps": args.steps, "micro_batch": args.micro, "grid_thw": GRID,
                              "vision": {"depth": 32, "width": args.width, "heads": args.heads}}
    counts = {}
    for side in SIDES:
        counts[side] = calls_per_update(side, steps=args.steps, micro=args.micro, width=8, heads=1)
        print(f"{side}: {counts[side]['vision_sdpa_calls']:,} vision SDPA calls per update of {args.steps} "
              f"screenshot steps ({counts[side]['text_sdpa_calls']:,} in the language model); the update with "
              f"the stand-in: {counts[side]['update_cpu_s_stand_in']:.1f} CPU s", flush=True)
    out["calls_per_update"] = counts
    out["layer_fwd_bwd"] = layer_seconds(args.screens, args.passes, args.layer_heads, 80)
    out["tower_fwd_bwd"] = tower_seconds(args.screens, args.passes, args.width, args.heads)
    print(json.dumps(out, indent=1))
    if args.json:
        args.json.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
