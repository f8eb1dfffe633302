"""Did a run's policy learn, or did its task mix change? Warm start vs final policy, on the
run's training and held-out tasks, greedy and sampled.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/policy_gap.py runs/learning/chain-fix/full-s0 --episodes 60

The stack's "success by policy version" is over the tasks the scheduler chose at each version,
and the scheduler moves to tasks it can still learn from: a rising curve there can be a changing
task mix. This evaluates both policies on fixed task sets (the recipe's training and held-out
tasks, cycled) at temperature 0 (the held-out number of `dart up`) and 1 (how rollouts sample),
so the four numbers per policy compare like with like.

``--by-instruction`` adds, for both policies, greedy held-out success per instruction (each
held-out task once): which skills the warm start brought and which RL added. On ``tiny`` (`make
run`) it is what showed why seeds 0 and 2 gain less than seed 1: their warm starts click the
yellow button every time it is asked for and red, green and blue at about chance.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

import torch
import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from dart.blobs import LocalBlobStore  # noqa: E402
from dart.config import build  # noqa: E402
from dart.recipe.config import make_tasks  # noqa: E402
from dart.recipe.episodes import evaluate, success_by_instruction  # noqa: E402
from dart.stack.config import StackConfig  # noqa: E402
from dart.stack.up import load_checkpoint_policy  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run", type=Path, help="a finished `dart up` run directory (stack.yaml, summary.json)")
    ap.add_argument("--episodes", type=int, default=60, help="episodes per number")
    ap.add_argument("--by-instruction", action="store_true",
                    help="also greedy held-out success per instruction, every held-out task once")
    args = ap.parse_args()
    torch.set_num_threads(1)
    cfg = build(StackConfig, yaml.safe_load((args.run / "stack.yaml").read_text()))
    summary = json.loads((args.run / "summary.json").read_text())
    train, held_out = make_tasks(cfg.recipe)
    store = LocalBlobStore(args.run / "blobs")
    rows = []
    split_rows: list[dict[str, tuple[int, float]]] = []
    for label, checkpoint in (("warm start", None), ("final", summary.get("final_checkpoint"))):
        policy = load_checkpoint_policy(Path(summary["warm_model"]), Path(checkpoint) if checkpoint else None)
        cells = []
        for tasks in (train, held_out):
            for temperature in (0.0, 1.0):
                at = dataclasses.replace(cfg, recipe=dataclasses.replace(cfg.recipe, eval_temperature=temperature))
                cells.append(evaluate(policy, tasks, args.episodes, store=store, cfg=at, phase=99))
                print(f"[policy_gap] {label}: {len(cells)} of 4", file=sys.stderr, flush=True)
        rows.append((label, cells))
        if args.by_instruction:
            greedy = dataclasses.replace(cfg, recipe=dataclasses.replace(cfg.recipe, eval_temperature=0.0))
            outcomes: list[tuple[dict, bool]] = []
            evaluate(policy, held_out, len(held_out), store=store, cfg=greedy, phase=99, outcomes=outcomes)
            split_rows.append(success_by_instruction(outcomes, min_tasks=1))
    print(f"{args.run}: {args.episodes} episodes per number")
    print("| policy | train, greedy | train, T=1 | held-out, greedy | held-out, T=1 |")
    print("|---|---|---|---|---|")
    for label, cells in rows:
        print(f"| {label} | " + " | ".join(f"{c:.1%}" for c in cells) + " |")
    if split_rows:
        print()
        print("| held-out instruction, greedy | tasks | warm start | final |")
        print("|---|---|---|---|")
        for ins, (tasks, warm) in split_rows[0].items():
            print(f"| {ins} | {tasks} | {warm:.1%} | {split_rows[1][ins][1]:.1%} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
