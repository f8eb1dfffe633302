"""The recipe as a function: the part of a run's config tree where the recipe's choices differ from
the services' own defaults.

`dart up` lays its config file, and then the command line's dotted overrides, over this preset
(:meth:`dart.stack.config.StackConfig.config_defaults`), so ``trainer.optim.lr=1e-4`` replaces the
recipe's 6e-4. Each setting here is a service's own key, set once: the preset sets no field to its
service's default (tests/test_config_homes.py checks it), and what a service's config does not
hold is :class:`~dart.recipe.config.Recipe`'s.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dart.recipe.config import Recipe

PROMPT = {"template": "compact", "min_pixels": 112 * 112}
"""The rollout workers' (and so the trainer's and the warm start's) prompt. The compact template
(instruction alone) and screens kept at their own 112 x 112 size (16 image tokens instead of the
100 that UI-TARS' 280 x 280 minimum makes) make a step a few times shorter: an SFT step costs a
fraction as much, and it grounds as fast per step."""


def policy_dir(recipe: Recipe, *, workdir: Path, warm_model: Path | None, osworld: bool) -> Path:
    """Where the policy RL starts from will be: the given ``warm_model``; a random tiny one in
    ``workdir/init`` for OSWorld tasks (no oracle demonstrations) or a recipe without SFT
    steps; else the SFT warm start in ``workdir/warm`` (:func:`dart.recipe.warmstart.warm_start`)."""
    if warm_model is not None:
        return warm_model.resolve()
    return workdir / ("init" if osworld or recipe.sft_steps == 0 else "warm")


def warm_start_kind(recipe: Recipe, *, warm_model: Path | None, osworld: bool) -> str:
    """How `dart up` gets that policy: ``given``, ``random`` (OSWorld) or ``sft``."""
    if warm_model is not None:
        return "given"
    return "random" if osworld else "sft"


def preset(recipe: Recipe, *, run_id: str, workdir: Path, pipeline: str, model_dir: Path, max_updates: int,
           downloads: Path | None = None) -> dict[str, Any]:
    """The services' settings of a run of ``recipe`` in ``workdir`` (absolute), with the policy in
    ``model_dir``, as a mapping of the config tree (``env``, ``rollout``, ``trainer``, ``data``);
    ``downloads``: the OSWorld download cache the env workers read."""
    blobs = str(workdir / "blobs")
    run = {"run_id": run_id, "blobs": blobs}
    env = {**run, "slots": 8, "heartbeat_s": 2.0, **({"xdesktop": {"downloads": str(downloads)}} if downloads else {})}
    rollout = {**run, "model": str(model_dir), "heartbeat_s": 2.0, "prompt": PROMPT,
               # qwen2vl's 0-1000 frame does not depend on the prompt's pixel bounds (qwen25vl's
               # resized-pixel frame is only rendered for UI-TARS' default bounds).
               "convention": "qwen2vl",
               # One torch thread per process: on a shared 2-core machine more threads fight over
               # the cores and run slower, not faster (`benchmarks/rollout_throughput.py --threads 2 1`).
               "hf": {"max_batch_size": 64, "threads": 1}}
    trainer = {**run, "model": str(model_dir), "checkpoint_dir": str(workdir / "checkpoints"), "worker_id": "trainer",
               "seed": recipe.seed, "prompt": PROMPT,
               # The trainer stops itself at the run's update budget (the stack's watch alone can
               # see a second update land before it stops the services).
               "max_updates": max_updates,
               # KL off and negative advantages halved: at full weight the pushed-down failures
               # flatten this small policy's logits.
               "loss": {"kl_coef": 0.0, "negative_scale": 0.5},
               # The paper's 1e-6 moves a random-init tiny model nowhere. 6e-4 reaches in the
               # updates that fit `make run`'s time about the gain 3e-4 reaches in nearly twice as
               # many (`benchmarks/learning.py --set trainer.optim.lr=3e-4` measures the other side).
               "optim": {"lr": 6e-4, "weight_decay": 0.0},
               "engine": {"device": "cpu", "threads": 1, "micro_batch_samples": 16}}
    data = {**run, "pipeline": pipeline, "store": {"dsn": f"chdb://{workdir / 'chdb'}"},
            "http": {"port": 0},
            # Rewards here are 0 or 1: a success is a full reward; every failed trajectory counts,
            # however short (episodes are a few steps; the oracle needs 1-2 on 'tiny').
            # Every step of these short episodes trains (chain.yaml selects DART's top 80 %).
            "curation": {"max_steps": 3, "min_steps": 2, "success_threshold": 1.0, "min_failed_steps": 0,
                         "entropy_top_fraction": 1.0},
            # Rollout sampling as the policy was trained (the oracle's answers are ~14 tokens).
            "scheduler": {"temperature": 1.0, "top_p": 1.0, "max_new_tokens": 24, "frequency_penalty": 0.0},
            # Many tasks and one clean optimiser step per update is what learns here: with 16
            # tasks, or one batch cut into 8 PPO mini-batches, each Adam step saw a few noisy
            # samples and success wandered (see benchmarks/learnability.py).
            "batcher": {"groups_per_batch": 64}}
    return {"env": env, "rollout": rollout, "trainer": trainer, "data": data}
