"""The run recipe: every knob of the learning run (model, tasks, prompt, warm start, RL) in one
frozen config, and the tasks it draws.

``dart up`` reads it from a config file's ``recipe:`` section; the one-process run
(:mod:`dart.recipe.learn`), the warm start (:mod:`dart.recipe.warmstart`) and evaluation
(:mod:`dart.recipe.episodes`) all take it. Defaults are the recipe that learns.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from dart.agent.prompt import PromptConfig
from dart.agent.tiny import TinySize
from dart.config import require
from dart.data.config import CurationConfig
from dart.env.synthetic import generate_tasks
from dart.train.loss import LossConfig

VLLM_RECIPE_MODEL = TinySize(num_attention_heads=2, num_key_value_heads=1, rope_theta=3.0, mrope_section=(1,) * 16)
"""The recipe's model for the vllm engine (configs/synthetic-vllm.yaml): the same 420,064
parameters as the default in heads of 32 (vLLM's CPU attention takes head sizes 32, 64, ... and
not the default's 16), one KV head, and the same rotary base and t/h/w interleave."""


@dataclass(frozen=True, kw_only=True)
class Recipe:
    """Every knob of the learnability run; the defaults are the recipe that works."""

    seed: int = 0
    """Seed of the model weights, task sampling, SFT shuffling and sampling seeds."""
    model: TinySize = field(default_factory=lambda: TinySize(rope_theta=3.0, mrope_section=(1,) * 8))
    """Size of the tiny random-weight Qwen2.5-VL. A low rotary base with t/h/w interleaved is
    what lets it tell where a button is: with Qwen's default (base 1e6, contiguous sections)
    the width axis turns by ~2e-4 rad per position and SFT never grounded (see the benchmark)."""
    threads: int = 1
    """torch CPU threads of the trainer and the rollout workers (1: on a shared 2-core machine more
    threads fight over the cores and run slower, not faster; `benchmarks/rollout_throughput.py
    --threads 2 1` beside a running `make run` measures it)."""
    preset: str = "tiny"
    """Synthetic task preset."""
    train_tasks: int = 400
    """Distinct training tasks (SFT demonstrations and RL groups are drawn from them)."""
    eval_tasks: int = 899
    """Distinct held-out tasks (split 'eval': no screen + goal of them is ever trained on). The
    ``tiny`` preset has 899 of them, and all are used: a greedy rate's uncertainty is which tasks
    were drawn (:mod:`dart.recipe.measure`), so 899 tasks give a standard error of ~1.7 points
    for one rate at 50 % and ~1.3 for a paired gain, where 200 gave ~3.5."""
    train_seed: int = 0
    """First generator seed of the training tasks."""
    eval_seed: int = 0
    """First generator seed of the held-out tasks."""
    dev_tasks: int = 0
    """Dev tasks: training-split tasks after the ``train_tasks`` (never trained on, never held out).
    ``dart up`` checks the policy on them every ``check_every`` updates and at the end, and hands
    over (and measures on the held-out tasks) the best check: a run that peaks before its budget
    ends keeps its peak, chosen without looking at the held-out tasks (0: the last policy)."""
    check_every: int = 15
    """Updates between two dev checks (with ``dev_tasks``)."""
    max_steps: int = 3
    """Policy turns per episode (the oracle needs 1-2 on 'tiny')."""
    prompt: PromptConfig = field(default_factory=lambda: PromptConfig(template="compact", min_pixels=112 * 112))
    """Prompt builder settings (the rollout workers and the trainer must use the same). The
    compact template (instruction alone) and screens kept at their own 112 x 112 size (16 image
    tokens instead of the 100 that UI-TARS' 280 x 280 minimum makes) make a step a few times
    shorter: an SFT step costs a fraction as much, and it grounds as fast per step."""
    convention: Literal["qwen25vl", "qwen2vl"] = "qwen2vl"
    """Coordinate convention of the answers (the rollout workers' ``convention``): qwen2vl's
    0-1000 frame does not depend on the prompt's pixel bounds (qwen25vl's resized-pixel frame
    is only rendered for UI-TARS' default bounds)."""
    thought: str | None = None
    """Thought line of the oracle answers (None: ``Action: ...`` only, ~13 tokens)."""
    sft_demos: int = 400
    """Training tasks whose oracle solutions form the SFT data."""
    sft_templates: tuple[str, ...] = ()
    """Only tasks of these templates give demonstrations (empty: every template); the others
    must be learned by RL from reward alone."""
    sft_withhold: tuple[str, ...] = ()
    """Tasks whose instruction names one of these words give no demonstrations (case-insensitive
    whole words): the warm start never sees them solved, RL learns them from reward alone."""
    sft_steps: int = 3000
    """Most SFT optimiser steps (micro-batches of fresh shuffles of the demonstrations); with
    ``sft_target_success`` SFT usually stops long before."""
    sft_target_success: float | None = 0.5
    """Stop SFT early, at the first check where greedy success on training tasks reaches this
    (a partial warm start at a chosen level, whatever the seed; None: run all ``sft_steps``)."""
    sft_check_every: int = 25
    """SFT steps between two checks of ``sft_target_success``."""
    sft_fine_check_every: int | None = None
    """SFT steps between two checks once a check has scored above zero (None: ``sft_check_every``).
    Success can sit near zero for most of SFT and then climb past the target within a few coarse
    checks (the ``chain`` preset does): finer checks once it moves stop SFT near the target rather
    than far above it."""
    sft_check_episodes: int = 100
    """Greedy episodes on training tasks per check (never the held-out tasks)."""
    sft_lr: float = 1e-3
    """AdamW learning rate of the warm start."""
    sft_micro_batch: int = 8
    """Samples per SFT optimiser step."""
    updates: int = 80
    """RL policy updates."""
    tasks_per_update: int = 64
    """Tasks (GRPO groups) rolled out per update. Many tasks and one clean optimiser step per
    update is what learns here: with 16 tasks, or one batch cut into 8 PPO mini-batches, each
    Adam step saw a few noisy samples and success wandered (see benchmarks/learnability.py)."""
    group_size: int = 8
    """Rollouts per task."""
    rl_lr: float = 6e-4
    """AdamW learning rate of RL (the paper's 1e-6 moves a random-init tiny model nowhere). 6e-4
    reaches in the updates that fit ``make run``'s time about the gain 3e-4 reaches in nearly twice
    as many (`benchmarks/learning.py --set recipe.rl_lr=3e-4` measures the other side)."""
    weight_decay: float = 0.0
    """AdamW weight decay of RL."""
    max_grad_norm: float = 2.0
    """Gradient clip of RL."""
    micro_batch: int = 16
    """Samples per forward/backward of the RL update."""
    ppo_epochs: int = 1
    """Passes over each RL batch (PPO-style reuse; 1: one pass)."""
    ppo_minibatches: int = 1
    """Optimiser steps per pass: the batch's micro-batches dealt into this many mini-batches
    (1: one step on the whole batch)."""
    temperature: float = 1.0
    """Rollout sampling temperature."""
    top_p: float = 1.0
    """Rollout nucleus."""
    max_new_tokens: int = 24
    """Longest response (the oracle's answers are ~14 tokens with the stop token)."""
    loss: LossConfig = field(default_factory=lambda: LossConfig(kl_coef=0.0, negative_scale=0.5))
    """Step-wise GRPO loss (DART clip-higher, dual clip, TIS; KL off and negative advantages
    halved here: at full weight the pushed-down failures flatten this small policy's logits)."""
    drop_uniform_groups: bool = True
    """Leave out groups whose trajectories all got the same reward (their advantage is 0)."""
    inject_experience: bool = False
    """DART's experience pool: a group whose rollouts all failed gets the task's oracle solution
    (reward 1, flagged for the loss's SFT term), as the data manager does with
    ``curation.inject_experience`` and ``dart up``'s ``experience_tasks``."""
    eval_episodes: int | None = None
    """Held-out episodes per evaluation, cycling through the held-out tasks (None: one per task;
    greedy answers are the same every time, so more episodes of the same tasks add nothing)."""
    eval_temperature: float = 0.0
    """Evaluation sampling temperature (0: greedy)."""
    eval_every: int = 0
    """One-process runs (``run_recipe``): held-out success every this many updates as well, a curve
    to tell a trend from the spread of one end point (each costs a held-out evaluation; 0: off)."""
    engine_batch: int = 64
    """Most prompts the hf engine answers in one generate call."""

    @property
    def held_out_episodes(self) -> int:
        """Episodes of one held-out evaluation: ``eval_episodes``, else one per held-out task."""
        return self.eval_episodes if self.eval_episodes is not None else self.eval_tasks

    def __post_init__(self) -> None:
        require(self.dev_tasks >= 0, "dev_tasks", f"must be >= 0, got {self.dev_tasks}")
        for name in ("train_tasks", "eval_tasks", "check_every", "max_steps", "sft_micro_batch", "tasks_per_update",
                     "group_size", "micro_batch", "sft_check_every", "sft_check_episodes", "ppo_epochs", "ppo_minibatches", "max_new_tokens", "engine_batch", "threads"):
            require(getattr(self, name) >= 1, name, f"must be >= 1, got {getattr(self, name)}")
        require(0 <= self.sft_demos <= self.train_tasks, "sft_demos",
                f"must be in [0, train_tasks={self.train_tasks}], got {self.sft_demos}")
        require(self.eval_episodes is None or self.eval_episodes >= 1, "eval_episodes",
                f"must be >= 1 or null (one per held-out task), got {self.eval_episodes}")
        require(self.eval_every >= 0, "eval_every", f"must be >= 0, got {self.eval_every}")
        require(self.updates >= 0, "updates", f"must be >= 0, got {self.updates}")
        require(self.sft_steps >= 0, "sft_steps", f"must be >= 0, got {self.sft_steps}")
        require(self.sft_steps == 0 or self.sft_demos >= 1, "sft_demos", "SFT steps need >= 1 demonstration")
        require(self.group_size >= 2, "group_size", f"GRPO needs >= 2 rollouts per task, got {self.group_size}")
        require(self.tasks_per_update <= self.train_tasks, "tasks_per_update", "must be <= train_tasks")
        require(self.sft_fine_check_every is None or self.sft_fine_check_every >= 1, "sft_fine_check_every",
                f"must be >= 1 or null, got {self.sft_fine_check_every}")
        require(self.sft_target_success is None or 0.0 < self.sft_target_success <= 1.0, "sft_target_success",
                f"must be in (0, 1] or null, got {self.sft_target_success}")


def curation_section(recipe: Recipe) -> dict[str, Any]:
    """The data manager's ``curation`` settings for this recipe: ``dart up`` writes them into the
    data manager's config, and the one-process learner judges its groups and builds its batches
    with them (:func:`curation_config`), so both curate alike. Rewards here are 0 or 1: a success
    is a full reward; every failed trajectory counts, however short (episodes are a few steps)."""
    return {"n_default": recipe.group_size, "max_steps": recipe.max_steps, "min_steps": min(2, recipe.max_steps),
            "success_threshold": 1.0, "min_failed_steps": 0,
            "entropy_top_fraction": recipe.loss.entropy_top_frac}


def curation_config(recipe: Recipe) -> CurationConfig:
    """:func:`curation_section` as the config, with the recipe's experience injection."""
    return CurationConfig(**curation_section(recipe), inject_experience=recipe.inject_experience)


def make_tasks(recipe: Recipe) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(training tasks, held-out tasks) of the recipe's preset."""
    train = generate_tasks(recipe.train_tasks, preset=recipe.preset, seed=recipe.train_seed, split="train")
    held_out = generate_tasks(recipe.eval_tasks, preset=recipe.preset, seed=recipe.eval_seed, split="eval")
    return train, held_out


def make_dev_tasks(recipe: Recipe) -> list[dict[str, Any]]:
    """The recipe's dev tasks: the ``dev_tasks`` training-split tasks that follow its training tasks
    (the generator is deterministic, so the first ``train_tasks`` of the longer list are exactly
    the training tasks and the rest are new to training; held-out tasks are another split)."""
    if not recipe.dev_tasks:
        return []
    tasks = generate_tasks(recipe.train_tasks + recipe.dev_tasks, preset=recipe.preset, seed=recipe.train_seed,
                           split="train")
    return tasks[recipe.train_tasks:]
