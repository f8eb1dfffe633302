"""The warm start: the tiny policy built, then SFT on oracle demonstrations until a target success.

Oracle solutions of the synthetic training tasks become UI-TARS answers in the rollout worker's
frame, with prompts built exactly as the rollout worker builds them (:func:`oracle_samples`);
:func:`warm_start` trains on them with the maths of ``dart train --sft``, stopping once greedy
success on training tasks reaches ``Recipe.sft_target_success`` (a deliberately partial warm
start, so RL has room).
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Callable, Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from dart.agent.actions import Action
from dart.agent.model import Policy, load_policy, save_policy
from dart.agent.prompt import blob_image_loader, build_messages, encode_prompt, prompt_hash
from dart.agent.tiny import build_tiny
from dart.agent.uitars import parse_actions, render_response
from dart.blobs import BlobStore
from dart.config import progress
from dart.env.synthetic import oracle_trace, render_png, screen_of
from dart.errors import ConfigError
from dart.events.manifest import BatchManifest, Sample, step_contexts
from dart.recipe.config import Recipe, Tree
from dart.recipe.episodes import evaluate
from dart.train.batch import prepare_samples
from dart.train.engine import TorchEngine
from dart.train.sft import sft_loop

Log = Callable[[str], None]


def oracle_text(action: Action, screen: tuple[int, int], cfg: Tree) -> str:
    """The UI-TARS answer of one oracle action, in the frame the rollout workers parse (their
    ``convention`` and prompt).

    ``render_response`` writes coordinates in the UI-TARS default pixel frame; a prompt with
    other smart-resize bounds would make the parser read them elsewhere, so that is refused
    (and a run's config refuses it at start-up: ``rollout.convention``).
    """
    convention, prompt = cfg.rollout.convention, cfg.rollout.prompt
    text = render_response(cfg.recipe.thought, [action], screen=screen, convention=convention)
    parsed = parse_actions(text, screen=screen, convention=convention,
                           min_pixels=prompt.min_pixels, max_pixels=prompt.max_pixels)
    if len(parsed) != 1 or not _same_action(parsed[0], action, screen):
        raise ConfigError(f"rollout.convention: oracle answer {text!r} parses to {parsed!r} with prompt pixels "
                          f"{prompt.min_pixels}..{prompt.max_pixels}: use the UI-TARS default bounds or "
                          "convention qwen2vl")
    return text


def _same_action(a: Action, b: Action, screen: tuple[int, int]) -> bool:
    tol = max(screen) / 100
    da, db = asdict(a), asdict(b)
    if da.keys() != db.keys():
        return False
    return all(abs(v - db[k]) <= tol if isinstance(v, float) else v == db[k] for k, v in da.items())


def oracle_samples(tasks: Sequence[dict[str, Any]], policy: Policy, store: BlobStore, cfg: Tree) -> list[Sample]:
    """One SFT sample per oracle step: screenshots into ``store``, answers rendered as UI-TARS
    text (ending with the stop token), prompts built exactly as the rollout worker builds them."""
    load = blob_image_loader(store)
    stop = policy.stop_token_ids[0]
    samples = []
    for task in tasks:
        spec = screen_of(task)
        screen = (int(spec["width"]), int(spec["height"]))
        turns = [(store.put(render_png(spec, state)), oracle_text(action, screen, cfg))
                 for state, action in oracle_trace(task)]
        for ctx, (_, text) in zip(step_contexts(task["instruction"], screen, turns), turns, strict=True):
            ids = [*policy.tokenizer(text, add_special_tokens=False)["input_ids"], stop]
            messages, images = build_messages(ctx, load, cfg.rollout.prompt)
            inputs = encode_prompt(policy.tokenizer, policy.image_processor, messages, images)
            samples.append(Sample(rollout_id=f"oracle:{task['id']}", step_index=ctx.step_index, task_id=task["id"],
                                  group_id=f"oracle:{task['id']}", context=ctx, prompt_hash=prompt_hash(inputs.input_ids),
                                  response_token_ids=ids, rollout_logprobs=[0.0] * len(ids), entropies=[],
                                  policy_version=0, reward=1.0, origin="oracle", sft=True))
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


def warm_start(cfg: Tree, workdir: Path, store: BlobStore, train: Sequence[dict[str, Any]],
               log: Log = print) -> Path:
    """Build the tiny policy and SFT it on oracle demonstrations; returns the ``workdir/warm`` policy.

    The maths of ``dart train --sft`` (prompt rebuild with hash check, plain NLL, the torch
    engine, ``save_policy``; the same data is written to ``workdir/sft.jsonl``), counted in
    optimiser steps instead of epochs: ``sft_steps`` micro-batches of ``sft_micro_batch``, cut from a
    fresh shuffle of the demonstrations every pass (a short last chunk is left out). With
    ``sft_target_success``, every ``sft_check_every`` steps (every ``sft_fine_check_every`` once a
    check scored above zero) the policy plays ``sft_check_episodes`` greedy episodes of training
    tasks, and SFT stops once their success reaches the target. Prompts and answers are the rollout
    workers' (``cfg.rollout``); the engine runs on the trainer's threads.
    """
    recipe = cfg.recipe
    init = build_tiny(workdir / "init", seed=recipe.seed, size=recipe.model)
    if recipe.sft_steps == 0:
        return init
    policy = load_policy(init)
    demos = oracle_samples(demo_tasks(train, recipe), policy, store, cfg)
    write_samples(demos, workdir / "sft.jsonl")  # the same data for `dart train --sft`
    kept, dropped = prepare_samples(manifest_of(demos, 0), tokenizer=policy.tokenizer,
                                    image_processor=policy.image_processor, load_image=blob_image_loader(store),
                                    prompt_cfg=cfg.rollout.prompt, check_hash=True, advantages=False)
    if dropped:
        raise ConfigError(f"{len(dropped)} oracle samples do not rebuild ({dropped[0].reason}: {dropped[0].detail})")
    # The trainer's optimiser and engine (weight decay off, its device and threads) at the SFT rate.
    engine = TorchEngine(policy.model, replace(cfg.trainer.optim, lr=recipe.sft_lr), cfg.trainer.engine)
    rng = random.Random(recipe.seed)
    check = random.Random(f"{recipe.seed}:sft-check").sample(list(train), min(len(train), recipe.sft_check_episodes))
    size = min(recipe.sft_micro_batch, len(kept))
    losses: list[float] = []
    best: tuple[float, int, dict[str, Any]] | None = None   # (success, step, weights) of the best check
    success = -1.0
    next_check, close = recipe.sft_check_every, False
    taken = sft_loop(engine, kept, policy.pad_token_id, micro_batch=size, steps=recipe.sft_steps, rng=rng,
                     whole_only=True)
    for step, (_, loss) in enumerate(progress(taken, total=recipe.sft_steps, desc="SFT", unit="step"), start=1):
        losses.append(loss)
        if step % 100 == 0 or step == recipe.sft_steps:
            log(f"sft step {step}/{recipe.sft_steps}: nll {sum(losses) / len(losses):.4f}")
            losses = []
        if recipe.sft_target_success is not None and step == next_check:
            success = evaluate(policy, check, recipe.sft_check_episodes, store=store, cfg=cfg, phase=-step)
            policy.model.train()
            log(f"sft step {step}: training-task success {success:.3f} (target {recipe.sft_target_success})")
            if success >= recipe.sft_target_success:
                log(f"sft step {step}: warm start reached its target")
                break
            # success can climb from ~0 to twice the target between two coarse checks: once it
            # has left zero (a later check at 0 is noise near the climb), look closer
            close = close or (success > 0 and recipe.sft_fine_check_every is not None)
            next_check = step + (recipe.sft_fine_check_every if close else recipe.sft_check_every)
            if best is None or success > best[0]:
                best = (success, step, engine.full_state_dict())
    state = engine.full_state_dict()
    if best is not None and success < recipe.sft_target_success and best[0] > success:
        # SFT on a few demonstrations can swing (0.19 at one check, 0.00 at the last): the
        # warm start is the best check's weights, not the last step's.
        log(f"sft: target {recipe.sft_target_success} not reached; keeping step {best[1]} "
            f"(training-task success {best[0]:.3f}, the last check {success:.3f})")
        state = best[2]
        policy.model.load_state_dict(state)
    save_policy(policy, workdir / "warm", state=state)
    return workdir / "warm"


def manifest_of(samples: list[Sample], update: int) -> BatchManifest:
    return BatchManifest(batch_id=f"recipe-{update}", seq=update, run_id="recipe", samples=samples)
