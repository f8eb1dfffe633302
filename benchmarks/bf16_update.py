"""Updates that survive bfloat16: how much of float32's learning a bfloat16 engine keeps, before
(plain AdamW on bfloat16 weights, ``engine.master_weights=off``) and after (the split float32
master, ``auto``), and what the split master costs in memory and step time.

Learning: :func:`dart.train.precision_check.run_check` (a Qwen-scale random model, one fixed batch,
``--steps`` updates through ``build_engine`` -> ``apply_update``; the loss is the response NLL) at
lr 1e-6 (DART's) and 1e-5; the ratio is the bfloat16 engine's loss drop over float32's from the same
start. Memory: optimizer-state bytes per trained parameter measured on the engines, then the 7B
arithmetic from them. Step time: one optimizer step over ``--step-mb`` MB of bfloat16 weights,
plain against split, interleaved passes (median, min-max). Prints a table; ``--json`` writes it.

    .venv/bin/python benchmarks/bf16_update.py [--steps 200] [--passes 5] [--json benchmarks/results/bf16_update.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from dart.train.config import OptimConfig
from dart.train.engine import make_optimizer
from dart.train.master_weights import join_master, split_master
from dart.train.precision_check import run_check

PARAMS_7B = 8.29e9
"""Qwen2.5-VL-7B (UI-TARS-1.5-7B's shape): 7.62 B language model + 0.68 B vision tower."""
PEAK_7B_GIB = 99.1
"""Measured peak of a 7B TorchEngine update on one H200, plain bf16 AdamW, KL reference, micro-batch 2
(issue 52): bf16 weights, gradients, bf16 moments, the reference copy and activations."""
ROUNDING_STEPS = 1000
"""Steps of the rounding demo: enough for bf16 Kahan's compensation to reach the size where it stalls."""
GPU_GIB = 139.8
"""What torch reports for an H200 (141 GB)."""


def state_bytes_per_param(split: bool, dtype: torch.dtype) -> float:
    """Optimizer-state bytes per parameter after one step (the step counter left out)."""
    p = torch.nn.Parameter(torch.zeros(4096, dtype=dtype))
    p.grad = torch.ones_like(p)
    opt = make_optimizer([p], OptimConfig(), split_master=split)
    opt.step()
    state = opt.state[p]
    return sum(t.numel() * t.element_size() for k, t in state.items() if k != "step") / p.numel()


def step_seconds(split: bool, params: list[torch.nn.Parameter]) -> float:
    opt = make_optimizer(params, OptimConfig(), split_master=split)
    opt.step()  # state allocated outside the timing
    t0 = time.perf_counter()
    opt.step()
    return time.perf_counter() - t0


def rounding_demo(steps: int, step: float = 1e-6, n: int = 4096) -> list[dict[str, object]]:
    """A constant AdamW-sized step (``step``, as Adam's normalised update is ~lr) applied ``steps``
    times to bfloat16 weights of 1.0 (an RMSNorm's) and ~N(0, 0.02) (a projection's), kept four ways;
    how far each moved against the intended ``steps * step`` (mean over elements, and spread)."""
    gen = torch.Generator().manual_seed(0)
    rows = []
    for label, w0 in (("norm 1.0", torch.ones(n)), ("N(0,0.02)", torch.randn(n, generator=gen) * 0.02)):
        start = w0.bfloat16()
        plain, kahan, comp, stoch, fp32 = start.clone(), start.clone(), torch.zeros_like(start), start.clone(), start.float()
        high, low = split_master(start.float())
        for _ in range(steps):
            plain -= step                                        # bf16 arithmetic: rounds to nearest
            y = -step - comp                                     # Kahan, compensation kept in bf16
            t = kahan + y
            comp, kahan = (t - kahan) - y, t
            exact = stoch.float() - step                         # stochastic rounding of the float32 result
            noise = torch.randint(0, 1 << 16, (n,), generator=gen, dtype=torch.int32)
            stoch = ((exact.view(torch.int32) + noise) >> 16 << 16).view(torch.float32).bfloat16()
            high, low = split_master(join_master(high, low) - step)  # the split master
            fp32 -= step
        for name, w in (("float32", fp32), ("plain", plain.float()), ("kahan-bf16", kahan.float() - comp.float()),
                        ("stochastic", stoch.float()), ("split", join_master(high, low))):
            moved = (start.float() - w) / (steps * step)
            rows.append({"weights": label, "method": name, "moved_mean": float(moved.mean()),
                         "moved_std": float(moved.std())})
    return rows


def memory_table() -> list[dict[str, object]]:
    """The 7B arithmetic: each option's bytes per parameter beyond today's, on today's peak."""
    plain = state_bytes_per_param(False, torch.bfloat16)
    split = state_bytes_per_param(True, torch.bfloat16)
    fp32_moments = state_bytes_per_param(False, torch.float32)
    options = [
        ("plain bf16 AdamW (today)", 0.0, "rounds most of every step away"),
        ("split float32 master (chosen)", split - plain, "exact float32-master update"),
        ("bf16 Kahan compensation", 2.0, "stalls where a step is < ~2^-16 of the weight (norms at lr 1e-6)"),
        ("stochastic rounding", 0.0, "right on average; each weight flips with probability step/spacing"),
        ("separate float32 master", 4.0, "as exact as split, 2 B/param more"),
        ("float32 master + float32 moments", 4.0 + fp32_moments - plain, "the classic mixed-precision recipe"),
    ]
    rows = []
    for name, extra, note in options:
        peak = PEAK_7B_GIB + extra * PARAMS_7B / 2**30
        rows.append({"option": name, "extra_bytes_per_param": extra, "peak_7b_gib": round(peak, 1),
                     "fits_h200": peak < GPU_GIB, "note": note})
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--passes", type=int, default=5)
    ap.add_argument("--step-mb", type=float, default=64.0, help="bf16 weights per optimizer-step timing")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    torch.set_num_threads(1)  # on a shared 2-core machine two threads contend with every other process
    out: dict[str, object] = {"steps": args.steps}

    print(f"{'lr':>6} {'mode':>5} {'fp32 drop':>10} {'bf16 drop':>10} {'ratio':>6}   "
          "cos / changed frac (kept, served) of q_proj, down_proj, input_layernorm, norm")
    learning = []
    for lr in (1e-6, 1e-5):
        for mode, r in run_check(lr=lr, steps=args.steps, modes=("off", "auto")).items():
            moves = "  ".join(f"{m.cosine:.3f}/{m.changed_frac:.3f},{m.served_changed_frac:.3f}"
                              for m in r.weights.values())
            print(f"{lr:>6.0e} {mode:>5} {r.loss_drop_fp32:>10.4f} {r.loss_drop:>10.4f} {r.drop_ratio:>6.3f}   {moves}")
            learning.append({"lr": lr, "master_weights": mode, "loss_drop_fp32": r.loss_drop_fp32,
                             "loss_drop_bf16": r.loss_drop, "ratio": r.drop_ratio, "seconds": r.seconds,
                             "weights": {k: vars(m) for k, m in r.weights.items()}})
    out["learning"] = learning

    out["rounding"] = rounding_demo(ROUNDING_STEPS)
    print(f"\n{ROUNDING_STEPS} steps of 1e-6 on bf16 weights, moved / intended (mean, std over elements):")
    for row in out["rounding"]:  # type: ignore[attr-defined]
        print(f"  {row['weights']:<10} {row['method']:<11} {row['moved_mean']:7.3f}  {row['moved_std']:7.3f}")

    print(f"\noptimizer state, bytes/param: plain bf16 {state_bytes_per_param(False, torch.bfloat16):.1f}, "
          f"split master {state_bytes_per_param(True, torch.bfloat16):.1f}, "
          f"float32 AdamW {state_bytes_per_param(False, torch.float32):.1f}")
    print(f"7B ({PARAMS_7B / 1e9:.2f} B params), on the measured {PEAK_7B_GIB} GiB peak of plain bf16, "
          f"{GPU_GIB} GiB GPU:")
    out["memory_7b"] = memory_table()
    for row in out["memory_7b"]:  # type: ignore[attr-defined]
        print(f"  {row['option']:<34} +{row['extra_bytes_per_param']:.0f} B/param -> {row['peak_7b_gib']:6.1f} GiB "
              f"{'fits' if row['fits_h200'] else 'DOES NOT FIT'}  ({row['note']})")

    n = int(args.step_mb * 2**20 / 2)
    params = [torch.nn.Parameter(torch.randn(n // 8, dtype=torch.float32).mul_(0.02).bfloat16()) for _ in range(8)]
    for p in params:
        p.grad = torch.randn_like(p)
    times: dict[bool, list[float]] = {False: [], True: []}
    for _ in range(args.passes):  # interleaved: load changes hit both sides alike
        for split in (False, True):
            times[split].append(step_seconds(split, params))
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"\noptimizer step over {args.step_mb:.0f} MB of bf16 weights, {args.passes} interleaved passes: "
          f"plain {med[False] * 1e3:.1f} ms ({min(times[False]) * 1e3:.1f}-{max(times[False]) * 1e3:.1f}), "
          f"split {med[True] * 1e3:.1f} ms ({min(times[True]) * 1e3:.1f}-{max(times[True]) * 1e3:.1f}), "
          f"split/plain {med[True] / med[False]:.2f}")
    out["step_ms"] = {"plain": [t * 1e3 for t in times[False]], "split": [t * 1e3 for t in times[True]]}
    if args.json:
        args.json.write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
