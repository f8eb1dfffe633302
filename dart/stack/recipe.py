"""The learnability recipe: SFT warm start, then step-wise GRPO, on synthetic tasks, in one process.

This is the proof that the tiny Qwen2.5-VL policy learns with dart's own parts, and the source
of the numbers the asynchronous stack (``make run``) must use to learn the same way. It calls
exactly what the services call — the prompt builder and the ``hf`` engine of the rollout
workers, the UI-TARS parser, the synthetic backend and its evaluator, the trainer's batch
preparation, loss and update, and ``dart train --sft`` — wired in-process without the bus::

    init = build_tiny(...)                                   # random-weight policy
    warm = run_sft(oracle_samples(train tasks))              # partial: stops at a target success
    evaluate(warm, eval tasks)                               # held-out success, >= 200 episodes
    for each update:                                         # step-wise GRPO
        trajectories = rollout_groups(engine, G rollouts of N train tasks)
        apply_update(engine, samples of groups with mixed rewards, loss)
    evaluate(final, eval tasks)

Episodes (:mod:`dart.stack.episodes`) follow :class:`dart.env.episode.Episode`.
"""

from __future__ import annotations

import asyncio
import copy
import json
import random
import re
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from dart.blobs import BlobStore, LocalBlobStore
from dart.config import require
from dart.env.actions import Action
from dart.env.synthetic import generate_tasks, oracle_trace, render_png, screen_of
from dart.env.uitars import parse_actions, render_response
from dart.errors import ConfigError
from dart.events import HistoryTurn
from dart.manifest import BatchManifest, PromptContext, Sample
from dart.rollout.model import Policy, TinySize
from dart.rollout.prompt import PromptConfig, blob_image_loader, build_messages, encode_prompt, prompt_hash
from dart.stack.episodes import (
    Step,
    Trajectory,
    eval_schedule,
    evaluate,
    evaluate_async,
    rollout_groups,
    run_episode,
    sampling_seed,
)
from dart.train.loss import LossConfig

__all__ = [
    "Recipe",
    "Step",
    "Trajectory",
    "eval_schedule",
    "evaluate",
    "evaluate_async",
    "make_tasks",
    "mixed_groups",
    "oracle_samples",
    "oracle_text",
    "rollout_groups",
    "run_episode",
    "run_recipe",
    "sampling_seed",
    "trajectory_samples",
    "warm_start",
    "write_samples",
]

Log = Callable[[str], None]


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
    """torch CPU threads (1: on a shared 2-core machine more threads run 5-10x slower)."""
    preset: str = "tiny"
    """Synthetic task preset."""
    train_tasks: int = 400
    """Distinct training tasks (SFT demonstrations and RL groups are drawn from them)."""
    eval_tasks: int = 200
    """Distinct held-out tasks (split 'eval': no screen + goal of them is ever trained on)."""
    train_seed: int = 0
    """First generator seed of the training tasks."""
    eval_seed: int = 0
    """First generator seed of the held-out tasks."""
    max_steps: int = 3
    """Policy turns per episode (the oracle needs 1-2 on 'tiny')."""
    prompt: PromptConfig = field(default_factory=lambda: PromptConfig(template="compact", min_pixels=112 * 112))
    """Prompt builder settings (the rollout workers and the trainer must use the same). The
    compact template (instruction alone) and screens kept at their own 112 x 112 size (16 image
    tokens instead of the 100 that UI-TARS' 280 x 280 minimum makes) bring a step to ~75 tokens:
    an SFT step costs ~30 ms instead of ~140 ms, and it grounds as fast per step."""
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
    ``sft_target_success`` SFT usually stops long before (~1,500 steps)."""
    sft_target_success: float | None = 0.5
    """Stop SFT early, at the first check where greedy success on training tasks reaches this
    (a partial warm start at a chosen level, whatever the seed; None: run all ``sft_steps``)."""
    sft_check_every: int = 25
    """SFT steps between two checks of ``sft_target_success``."""
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
    rl_lr: float = 3e-4
    """AdamW learning rate of RL (the paper's 1e-6 moves a random-init tiny model nowhere)."""
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
    eval_episodes: int = 200
    """Held-out episodes per evaluation (tasks are cycled when fewer)."""
    eval_temperature: float = 0.0
    """Evaluation sampling temperature (0: greedy)."""
    engine_batch: int = 64
    """Most prompts the hf engine answers in one generate call."""

    def __post_init__(self) -> None:
        for name in ("train_tasks", "eval_tasks", "max_steps", "sft_micro_batch", "tasks_per_update",
                     "group_size", "micro_batch", "sft_check_every", "sft_check_episodes", "ppo_epochs", "ppo_minibatches", "max_new_tokens", "eval_episodes", "engine_batch", "threads"):
            require(getattr(self, name) >= 1, name, f"must be >= 1, got {getattr(self, name)}")
        require(0 <= self.sft_demos <= self.train_tasks, "sft_demos",
                f"must be in [0, train_tasks={self.train_tasks}], got {self.sft_demos}")
        require(self.updates >= 0, "updates", f"must be >= 0, got {self.updates}")
        require(self.sft_steps >= 0, "sft_steps", f"must be >= 0, got {self.sft_steps}")
        require(self.sft_steps == 0 or self.sft_demos >= 1, "sft_demos", "SFT steps need >= 1 demonstration")
        require(self.group_size >= 2, "group_size", f"GRPO needs >= 2 rollouts per task, got {self.group_size}")
        require(self.tasks_per_update <= self.train_tasks, "tasks_per_update", "must be <= train_tasks")
        require(self.sft_target_success is None or 0.0 < self.sft_target_success <= 1.0, "sft_target_success",
                f"must be in (0, 1] or null, got {self.sft_target_success}")


# ---------------------------------------------------------------- pure helpers


def oracle_text(action: Action, screen: tuple[int, int], recipe: Recipe) -> str:
    """The UI-TARS answer of one oracle action, in the frame the rollout worker parses.

    ``render_response`` writes coordinates in the UI-TARS default pixel frame; a prompt with
    other smart-resize bounds would make the parser read them elsewhere, so that is refused.
    """
    text = render_response(recipe.thought, [action], screen=screen, convention=recipe.convention)
    parsed = parse_actions(text, screen=screen, convention=recipe.convention,
                           min_pixels=recipe.prompt.min_pixels, max_pixels=recipe.prompt.max_pixels)
    if len(parsed) != 1 or not _same_action(parsed[0], action, screen):
        raise ConfigError(f"oracle answer {text!r} parses to {parsed!r} with prompt pixels "
                         f"{recipe.prompt.min_pixels}..{recipe.prompt.max_pixels}: use the UI-TARS default "
                         "bounds or convention qwen2vl")
    return text


def _same_action(a: Action, b: Action, screen: tuple[int, int]) -> bool:
    tol = max(screen) / 100
    da, db = asdict(a), asdict(b)
    if da.keys() != db.keys():
        return False
    return all(abs(v - db[k]) <= tol if isinstance(v, float) else v == db[k] for k, v in da.items())


def mixed_groups(trajectories: Sequence[Trajectory]) -> list[Trajectory]:
    """The trajectories of groups whose rewards are not all equal (the others have A = 0)."""
    rewards: dict[str, set[float]] = {}
    for t in trajectories:
        rewards.setdefault(t.group_id, set()).add(t.reward)
    return [t for t in trajectories if len(rewards[t.group_id]) > 1]


def trajectory_samples(trajectories: Sequence[Trajectory], *, policy_version: int) -> list[Sample]:
    """Step-wise samples (every step carries its trajectory's reward), as the data manager batches them."""
    return [
        Sample(rollout_id=t.rollout_id, step_index=i, task_id=t.task_id, group_id=t.group_id,
               context=s.context, prompt_hash=s.prompt_hash, response_token_ids=s.token_ids,
               rollout_logprobs=s.logprobs, entropies=s.entropies, policy_version=policy_version,
               reward=t.reward)
        for t in trajectories for i, s in enumerate(t.steps) if s.token_ids
    ]


def oracle_samples(tasks: Sequence[dict[str, Any]], policy: Policy, store: BlobStore, recipe: Recipe) -> list[Sample]:
    """One SFT sample per oracle step: screenshots into ``store``, answers rendered as UI-TARS
    text (ending with the stop token), prompts built exactly as the rollout worker builds them."""
    load = blob_image_loader(store)
    stop = policy.stop_token_ids[0]
    samples = []
    for task in tasks:
        spec = screen_of(task)
        screen = (int(spec["width"]), int(spec["height"]))
        history: list[HistoryTurn] = []
        for i, (state, action) in enumerate(oracle_trace(task)):
            digest = store.put(render_png(spec, state))
            ctx = PromptContext(instruction=task["instruction"], step_index=i, screenshot_digest=digest,
                                screen_width=screen[0], screen_height=screen[1], history=list(history))
            text = oracle_text(action, screen, recipe)
            ids = [*policy.tokenizer(text, add_special_tokens=False)["input_ids"], stop]
            messages, images = build_messages(ctx, load, recipe.prompt)
            inputs = encode_prompt(policy.tokenizer, policy.image_processor, messages, images)
            samples.append(Sample(rollout_id=f"oracle:{task['id']}", step_index=i, task_id=task["id"],
                                  group_id=f"oracle:{task['id']}", context=ctx, prompt_hash=prompt_hash(inputs.input_ids),
                                  response_token_ids=ids, rollout_logprobs=[0.0] * len(ids), entropies=[],
                                  policy_version=0, reward=1.0, origin="oracle", sft=True))
            history.append(HistoryTurn(step_index=i, screenshot_digest=digest, response_text=text))
    return samples


def write_samples(samples: Sequence[Sample], path: Path) -> Path:
    """A JSON-lines experience file ``dart train --sft`` reads."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(asdict(s)) + "\n" for s in samples))
    return path


def template_of(task: dict[str, Any]) -> str:
    return str(task["config"][0]["parameters"].get("template", ""))


def demo_tasks(train: Sequence[dict[str, Any]], recipe: Recipe) -> list[dict[str, Any]]:
    """The training tasks whose oracle solutions are the SFT data: the first ``sft_demos`` of the
    ``sft_templates`` (all templates when empty)."""
    withheld = {w.lower() for w in recipe.sft_withhold}
    pool = [t for t in train if (not recipe.sft_templates or template_of(t) in recipe.sft_templates)
            and not withheld & set(re.findall(r"\w+", t["instruction"].lower()))]
    return pool[: recipe.sft_demos]


def make_tasks(recipe: Recipe) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(training tasks, held-out tasks) of the recipe's preset."""
    train = generate_tasks(recipe.train_tasks, preset=recipe.preset, seed=recipe.train_seed, split="train")
    held_out = generate_tasks(recipe.eval_tasks, preset=recipe.preset, seed=recipe.eval_seed, split="eval")
    return train, held_out


# ---------------------------------------------------------------- the whole run


def warm_start(recipe: Recipe, workdir: Path, store: BlobStore, train: Sequence[dict[str, Any]],
               log: Log = print) -> Path:
    """Build the tiny policy and SFT it on oracle demonstrations; returns the ``workdir/warm`` policy.

    The maths of ``dart train --sft`` (prompt rebuild with hash check, plain NLL, the torch
    engine, ``save_policy_dir``; the same data is written to ``workdir/sft.jsonl``), counted in
    optimiser steps instead of epochs: ``sft_steps`` micro-batches of ``sft_micro_batch``, cut from a
    fresh shuffle of the demonstrations every pass (a short last chunk is left out). With
    ``sft_target_success``, every ``sft_check_every`` steps the policy plays ``sft_check_episodes``
    greedy episodes of training tasks, and SFT stops once their success reaches the target.
    """
    import torch

    from dart.rollout.model import build_tiny, load_policy
    from dart.train.batch import collate, prepare_samples
    from dart.train.config import EngineConfig, OptimConfig
    from dart.train.engine import TorchEngine
    from dart.train.loss import nll_loss
    from dart.train.sft import save_policy_dir

    init = build_tiny(workdir / "init", seed=recipe.seed, size=recipe.model)
    if recipe.sft_steps == 0:
        return init
    policy = load_policy(init)
    demos = oracle_samples(demo_tasks(train, recipe), policy, store, recipe)
    write_samples(demos, workdir / "sft.jsonl")  # the same data for `dart train --sft`
    kept, dropped = prepare_samples(manifest_of(demos, 0), tokenizer=policy.tokenizer,
                                    image_processor=policy.image_processor, load_image=blob_image_loader(store),
                                    prompt_cfg=recipe.prompt, check_hash=True, advantages=False)
    if dropped:
        raise ConfigError(f"{len(dropped)} oracle samples do not rebuild ({dropped[0].reason}: {dropped[0].detail})")
    engine = TorchEngine(policy.model, OptimConfig(lr=recipe.sft_lr, weight_decay=0.0),
                         EngineConfig(device="cpu", threads=recipe.threads))
    rng = random.Random(recipe.seed)
    check = random.Random(f"{recipe.seed}:sft-check").sample(list(train), min(len(train), recipe.sft_check_episodes))
    size = min(recipe.sft_micro_batch, len(kept))
    losses: list[float] = []
    for step, chunk in enumerate(shuffled_chunks(kept, size, rng), start=1):
        batch = collate(chunk, torch.ones(size, dtype=torch.bool), pad_id=policy.pad_token_id)
        logp_B_T, _ = engine.forward(batch)
        loss, _ = nll_loss(logp_B_T, batch.mask_B_T)
        engine.backward(loss)
        engine.step()
        losses.append(float(loss.detach()))
        if step % 100 == 0 or step == recipe.sft_steps:
            log(f"sft step {step}/{recipe.sft_steps}: nll {sum(losses) / len(losses):.4f}")
            losses = []
        if recipe.sft_target_success is not None and step % recipe.sft_check_every == 0:
            success = evaluate(policy, check, recipe.sft_check_episodes, store=store, recipe=recipe, phase=-step)
            policy.model.train()
            log(f"sft step {step}: training-task success {success:.3f} (target {recipe.sft_target_success})")
            if success >= recipe.sft_target_success:
                log(f"sft step {step}: warm start reached its target")
                break
        if step == recipe.sft_steps:
            break
    save_policy_dir(engine, policy, workdir / "warm")
    return workdir / "warm"


def shuffled_chunks(items: Sequence[Any], size: int, rng: random.Random) -> Iterator[list[Any]]:
    """Endless chunks of ``size`` items, each pass over ``items`` a fresh shuffle
    (:func:`dart.train.sft.epoch_chunks`); a short last chunk of a pass is left out."""
    from dart.train.sft import epoch_chunks

    if not 1 <= size <= len(items):
        raise ValueError(f"chunk size must be in [1, {len(items)}], got {size}")
    while True:
        for chunk in epoch_chunks(len(items), size, rng):
            if len(chunk) == size:
                yield [items[i] for i in chunk]


def injected_samples(trajectories: Sequence[Trajectory], tasks: dict[str, dict[str, Any]], policy: Policy,
                     store: BlobStore, recipe: Recipe, *, update: int) -> list[Sample]:
    """The oracle solution of every all-fail group's task, joined to that group (reward 1, ``sft``)."""
    rewards: dict[str, set[float]] = {}
    task_of: dict[str, str] = {}
    for t in trajectories:
        rewards.setdefault(t.group_id, set()).add(t.reward)
        task_of[t.group_id] = t.task_id
    out: list[Sample] = []
    for group_id, seen in sorted(rewards.items()):
        if max(seen) < 1.0:
            for s in oracle_samples([tasks[task_of[group_id]]], policy, store, recipe):
                out.append(replace(s, group_id=group_id, rollout_id=f"oracle:{group_id}", policy_version=update))
    return out


def rl_update(engine: Any, ref: Any, policy: Policy, trajectories: Sequence[Trajectory], *, store: BlobStore,
              recipe: Recipe, update: int, tasks: dict[str, dict[str, Any]] | None = None) -> dict[str, float]:
    """One GRPO update on the trajectories, through the trainer's own batch preparation and update."""
    from dart.train.batch import micro_batches, prepare_samples, step_mask
    from dart.train.update import apply_update

    chosen = mixed_groups(trajectories) if recipe.drop_uniform_groups else list(trajectories)
    samples = trajectory_samples(chosen, policy_version=update)
    if recipe.inject_experience and tasks is not None:
        samples += injected_samples(trajectories, tasks, policy, store, recipe, update=update)
    if not samples:
        return {"samples": 0.0}
    kept, dropped = prepare_samples(manifest_of(samples, update), tokenizer=policy.tokenizer,
                                    image_processor=policy.image_processor, load_image=blob_image_loader(store),
                                    prompt_cfg=recipe.prompt, check_hash=True)
    if broken := [d for d in dropped if d.reason != "vision_token"]:
        raise RuntimeError(f"{len(broken)} samples dropped ({broken[0].reason}: {broken[0].detail}): the "
                           "trainer must rebuild the rollout prompts exactly")
    batches = micro_batches(kept, step_mask(kept, recipe.loss.entropy_top_frac), size=recipe.micro_batch,
                            pad_id=policy.pad_token_id)
    policy.model.train()
    result = apply_update(engine, batches, recipe.loss, ref, epochs=recipe.ppo_epochs,
                          minibatches=recipe.ppo_minibatches)
    policy.model.eval()
    means = result.stats.means()
    return {"samples": float(result.num_samples), "grad_norm": result.grad_norm,
            "loss": means.get("loss/total", 0.0), "kl": means.get("loss/kl", 0.0),
            "entropy": means.get("entropy/mean", 0.0)}


def run_recipe(recipe: Recipe, workdir: str | Path, *, log: Log = print, warm: Path | None = None) -> dict[str, Any]:
    """Build, warm-start, evaluate, train with RL, evaluate again; returns the numbers.

    Keys: warm_success, rl_success, delta, eval_episodes, train_success (rollout success per
    update), updates (per-update stats), recipe, and wall seconds per phase (sft_s, eval_warm_s,
    rl_s, eval_rl_s, total_s). The warm start is in ``workdir/warm``, the RL policy in
    ``workdir/final``. ``warm``: start RL from this policy directory instead (no build, no SFT),
    to study RL settings on one warm start.
    """
    import torch

    from dart.rollout.hf_engine import HFEngine, HFEngineConfig
    from dart.rollout.model import load_policy
    from dart.train.config import EngineConfig, OptimConfig
    from dart.train.engine import ReferencePolicy, TorchEngine
    from dart.train.sft import save_policy_dir

    t_all = time.perf_counter()
    torch.set_num_threads(recipe.threads)
    torch.manual_seed(recipe.seed)
    workdir = Path(workdir)
    store = open_workdir(workdir)
    train, held_out = make_tasks(recipe)
    out: dict[str, Any] = {"eval_episodes": recipe.eval_episodes, "recipe": asdict(recipe)}

    t0 = time.perf_counter()
    warm_dir = warm or warm_start(recipe, workdir, store, train, log)
    out["sft_s"] = elapsed(t0)
    policy = load_policy(warm_dir)
    t0 = time.perf_counter()
    out["warm_success"] = evaluate(policy, held_out, recipe.eval_episodes, store=store, recipe=recipe, phase=1)
    out["eval_warm_s"] = elapsed(t0)
    log(f"warm start: held-out success {out['warm_success']:.3f} over {recipe.eval_episodes} episodes "
        f"(sft {out['sft_s']} s, eval {out['eval_warm_s']} s)")

    t0 = time.perf_counter()
    engine = TorchEngine(policy.model, OptimConfig(lr=recipe.rl_lr, weight_decay=recipe.weight_decay,
                                                   max_grad_norm=recipe.max_grad_norm),
                         EngineConfig(device="cpu", threads=recipe.threads))
    ref = (ReferencePolicy(copy.deepcopy(policy.model), engine.device, engine.dtype)
           if recipe.loss.kl_coef > 0 else None)
    rng = random.Random(recipe.seed)
    by_id = {t["id"]: t for t in train}
    out["train_success"], out["updates"] = [], []

    async def rl_loop() -> None:
        gen = HFEngine(policy, HFEngineConfig(max_batch_size=recipe.engine_batch))
        try:
            for u in range(recipe.updates):
                tu = time.perf_counter()
                policy.model.eval()
                trajectories = await rollout_groups(gen, rng.sample(train, recipe.tasks_per_update), store=store,
                                                    recipe=recipe, update=u)
                success = sum(t.reward >= 1.0 for t in trajectories) / len(trajectories)
                out["train_success"].append(success)
                tr = elapsed(tu)
                stats = rl_update(engine, ref, policy, trajectories, store=store, recipe=recipe, update=u,
                                  tasks=by_id)
                out["updates"].append({**stats, "rollout_success": success, "rollouts_s": tr, "update_s": elapsed(tu)})
                log(f"update {u + 1}/{recipe.updates}: rollout success {success:.3f}, "
                    f"{int(stats['samples'])} samples, loss {stats.get('loss', 0.0):+.4f}, "
                    f"grad {stats.get('grad_norm', 0.0):.3f}, rollouts {tr} s, total {elapsed(tu)} s")
        finally:
            await gen.close()

    asyncio.run(rl_loop())
    out["rl_s"] = elapsed(t0)
    save_policy_dir(engine, policy, workdir / "final")
    t0 = time.perf_counter()
    out["rl_success"] = evaluate(policy, held_out, recipe.eval_episodes, store=store, recipe=recipe, phase=2)
    out["eval_rl_s"] = elapsed(t0)
    out["delta"] = out["rl_success"] - out["warm_success"]
    out["total_s"] = elapsed(t_all)
    log(f"RL: held-out success {out['rl_success']:.3f} over {recipe.eval_episodes} episodes "
        f"(warm start {out['warm_success']:.3f}, delta {out['delta']:+.3f}; rl {out['rl_s']} s, "
        f"eval {out['eval_rl_s']} s, total {out['total_s']} s)")
    return out


def open_workdir(workdir: Path) -> LocalBlobStore:
    workdir.mkdir(parents=True, exist_ok=True)
    return LocalBlobStore(workdir / "blobs")


def manifest_of(samples: list[Sample], update: int) -> BatchManifest:
    return BatchManifest(batch_id=f"recipe-{update}", seq=update, run_id="recipe", samples=samples)


def elapsed(t0: float) -> float:
    return round(time.perf_counter() - t0, 1)
