"""Learnability: does RL beat its own SFT warm start on held-out synthetic tasks?

Runs :func:`dart.stack.recipe.run_recipe` (tiny Qwen2.5-VL -> partial SFT on oracle
demonstrations -> held-out eval -> step-wise GRPO -> held-out eval) in one process with the
default :class:`~dart.stack.recipe.Recipe`, and prints warm-start success, RL success, their
difference, the episode count and the wall time of each phase.

    .venv/bin/python benchmarks/learnability.py [--workdir DIR] [--quick] [--set key=value ...]

``--set`` overrides a top-level recipe field (JSON values: ``--set updates=10 --set rl_lr=1e-3``;
``--set 'loss={"kl_coef": 0.1}'`` overrides fields of the loss).

What was measured with it on the 2-core machine (2026-11-23; 200 held-out episodes, greedy;
RL = 8 tasks x 8 rollouts per update unless said; ``--warm`` runs start from the first row's
warm start):

============================================  =======  =======  ======================================
configuration                                 warm     RL       note
============================================  =======  =======  ======================================
defaults (SFT 700 steps; RL 40 x lr 3e-4)     0.400    0.395    -0.5 points; 276 s SFT, 461 s RL
rl_lr=1e-3                                    -        -        rollout success 0.44 -> 0.14 in 6 updates
rl_lr=3e-3                                    -        -        collapses: 0.44 -> 0.06 in 3 updates
temperature=0.7 top_p=0.9 (DART sampling)     0.400    0.385    -1.5 points
rl_lr=1e-4 inject_experience=true             0.400    0.385    -1.5 points
rl_lr=1e-4, T 0.7, 16 tasks x 8, 25 updates   0.400    0.410    +1.0 points
sft_templates=[click_color] (no RL yet)       0.510    -        click_color 0.54, check_then_ok 0/11
ppo_epochs=2 ppo_minibatches=4 (8 steps/batch)  0.400  -        flat 0.2-0.5 over 34 updates
ppo 1 x 4, rl_lr=1e-3, T 0.7                  -        -        collapses to 0.00 by update 21
DART loss (kl 0.1), T 0.7, ppo 2 x 4          0.400    0.405    +0.5 points
DART loss (kl 0.1), T 0.7, rl_lr=1e-3         0.400    0.315    -8.5 points
A<0 scaled x0.2, kl 0.1, T 0.7, lr 1e-3 (*)   0.400    0.385    -1.5 points, stable
A<0 scaled x0 (successes only), T 0.7, 1e-3 (*) 0.400  0.400    +0.0 points, stable
============================================  =======  =======  ======================================

(*) an experiment outside the repo (advantages patched in the trainer's batch preparation): with
the negative advantages damped the collapse goes away, but the policy still does not improve in
40 updates — the signal per update, not the instability alone, is what is missing.

How the fast settings fail: the collapsed policy (ppo 1 x 4, lr 1e-3) still answers
``click(start_box='(72,72)')`` greedily, but sampled at 0.7 it writes garbage — its token
distribution went flat. Most sampled answers fail, their negative advantages push their tokens
down, and the cheapest way for a 420k-parameter model to lower many tokens at once is to shrink
every logit: entropy explodes, rollouts stop succeeding, no group is mixed, learning stops.

SFT alone, for scale (same seed, 100 held-out episodes): 0.23 after 200-500 steps, 0.36 after
700, 0.45 after 1000 (26 s per 100 steps). Two ways to make grounding faster did not: 112 x 112
screens fed at their own size (16 image tokens instead of 100, ``convention=qwen2vl``; 14 s per
100 steps) reach 0.25 at 600, 0.32 at 1000, 0.34 at 2000; a model twice as wide (hidden 128,
8 heads, vision 64; 58 s per 100 steps) 0.28 at 400, 0.39 at 600; position cues (the background
of each quadrant of the 'tiny' screen tinted differently, an experiment outside the repo) 0.31 at
400, 0.36 at 700; a language model twice as deep (4 layers; 42 s per 100 steps) 0.335 at 400,
0.33 at 700 (200 episodes each).

The whole stack, ``make run`` (asynchronous RL for 8 min: 30 updates, 2,263 trajectories):
warm start 0.400, RL 0.400. RL moves the policy the right way (a 3-step check on one batch: mean
log-prob +0.04 for A > 0 samples, -0.22 for A < 0) but 40 updates carry far less signal than the
~300 SFT steps that add ~9 points here, and a learning rate high enough to move faster
destabilises the policy. The 10-point goal of ``make run`` is not met by any of these.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from dataclasses import fields, replace
from pathlib import Path

from dart.stack.recipe import Recipe, run_recipe

QUICK = {"train_tasks": 8, "eval_tasks": 4, "sft_demos": 8, "sft_steps": 2, "updates": 2, "tasks_per_update": 2,
         "group_size": 2, "eval_episodes": 8}
"""A smoke-test recipe (seconds): the pipeline runs, nothing is learned."""


def parse_overrides(items: list[str]) -> dict[str, object]:
    """``key=value`` pairs (values as JSON, else strings) for top-level scalar Recipe fields."""
    known = {f.name for f in fields(Recipe)}
    out: dict[str, object] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or key not in known:
            raise SystemExit(f"--set wants key=value with a Recipe field, got {item!r} (fields: {sorted(known)})")
        try:
            out[key] = json.loads(raw)
        except json.JSONDecodeError:
            out[key] = raw
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workdir", type=Path, default=None, help="keep models and blobs here (default: a temp dir)")
    parser.add_argument("--warm", type=Path, default=None,
                        help="start RL from this policy directory (e.g. an earlier run's WORKDIR/warm): no build, no SFT")
    parser.add_argument("--quick", action="store_true", help="a seconds-long smoke run instead of the recipe")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    args = parser.parse_args()
    overrides = parse_overrides(args.overrides)
    if isinstance(overrides.get("loss"), dict):  # --set 'loss={"kl_coef": 0.1}': fields over the recipe's loss
        overrides["loss"] = replace(Recipe().loss, **overrides["loss"])
    recipe = replace(Recipe(), **(QUICK if args.quick else {}), **overrides)
    with tempfile.TemporaryDirectory(prefix="dart-learnability-") as tmp:
        out = run_recipe(recipe, args.workdir or Path(tmp), warm=args.warm)
    print()
    print(f"warm-start success  {out['warm_success']:.3f}  ({out['eval_episodes']} held-out episodes)")
    print(f"RL success          {out['rl_success']:.3f}  ({out['eval_episodes']} held-out episodes)")
    print(f"difference          {100 * out['delta']:+.1f} points")
    print(f"wall time           sft {out['sft_s']} s, eval warm {out['eval_warm_s']} s, rl {out['rl_s']} s "
          f"({len(out['train_success'])} updates), eval rl {out['eval_rl_s']} s, total {out['total_s']} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
