"""The run recipe's own knobs (model, tasks, warm start, dev check, evaluation) and the tasks it draws.

A recipe is not a second schema of the services: what a service holds (the trainer's loss and
optimiser, the rollout workers' prompt and convention, the data manager's curation and
sampling) lives in that service's config, in the run's config tree
(:class:`dart.stack.config.StackConfig`), and the recipe's choices for it are a preset of that
tree (:func:`dart.recipe.preset.preset`). :class:`Recipe` holds only what no service holds;
the in-process parts (warm start, evaluation, the one-process learner) read the rest from the
tree (:class:`Tree`). Defaults are the recipe that learns.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from dart.agent.tiny import TinySize
from dart.config import require
from dart.data.config import DataConfig
from dart.env.synthetic import generate_tasks
from dart.rollout.config import RolloutWorkerConfig
from dart.train.config import TrainerConfig

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
    drop_uniform_groups: bool = True
    """Leave out groups whose trajectories all got the same reward (their advantage is 0)."""
    eval_episodes: int | None = None
    """Held-out episodes per evaluation, cycling through the held-out tasks (None: one per task;
    greedy answers are the same every time, so more episodes of the same tasks add nothing)."""
    eval_temperature: float = 0.0
    """Evaluation sampling temperature (0: greedy)."""
    eval_every: int = 0
    """One-process runs (``run_recipe``): held-out success every this many updates as well, a curve
    to tell a trend from the spread of one end point (each costs a held-out evaluation; 0: off)."""

    @property
    def held_out_episodes(self) -> int:
        """Episodes of one held-out evaluation: ``eval_episodes``, else one per held-out task."""
        return self.eval_episodes if self.eval_episodes is not None else self.eval_tasks

    def __post_init__(self) -> None:
        require(self.dev_tasks >= 0, "dev_tasks", f"must be >= 0, got {self.dev_tasks}")
        for name in ("train_tasks", "eval_tasks", "check_every", "sft_micro_batch", "sft_check_every",
                     "sft_check_episodes"):
            require(getattr(self, name) >= 1, name, f"must be >= 1, got {getattr(self, name)}")
        require(0 <= self.sft_demos <= self.train_tasks, "sft_demos",
                f"must be in [0, train_tasks={self.train_tasks}], got {self.sft_demos}")
        require(self.eval_episodes is None or self.eval_episodes >= 1, "eval_episodes",
                f"must be >= 1 or null (one per held-out task), got {self.eval_episodes}")
        require(self.eval_every >= 0, "eval_every", f"must be >= 0, got {self.eval_every}")
        require(self.updates >= 0, "updates", f"must be >= 0, got {self.updates}")
        require(self.sft_steps >= 0, "sft_steps", f"must be >= 0, got {self.sft_steps}")
        require(self.sft_steps == 0 or self.sft_demos >= 1, "sft_demos", "SFT steps need >= 1 demonstration")
        require(self.sft_fine_check_every is None or self.sft_fine_check_every >= 1, "sft_fine_check_every",
                f"must be >= 1 or null, got {self.sft_fine_check_every}")
        require(self.sft_target_success is None or 0.0 < self.sft_target_success <= 1.0, "sft_target_success",
                f"must be in (0, 1] or null, got {self.sft_target_success}")

class Tree(Protocol):
    """The parts of a run's config tree (:class:`dart.stack.config.StackConfig`) that the warm start,
    evaluation and the one-process learner read: each fact where its service holds it."""

    @property
    def recipe(self) -> Recipe: ...
    @property
    def rollout(self) -> RolloutWorkerConfig: ...
    @property
    def trainer(self) -> TrainerConfig: ...
    @property
    def data(self) -> DataConfig: ...
    @property
    def experience_tasks(self) -> int: ...


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
