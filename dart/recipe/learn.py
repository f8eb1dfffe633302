"""The learning recipe in one process: SFT warm start, then step-wise GRPO, on synthetic tasks.

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
        apply_update(engine, batch_of(trajectories), loss)    # the data manager's curation and batch
    evaluate(final, eval tasks)

Episodes (:mod:`dart.recipe.episodes`) run the env worker's episode loop.
"""

from __future__ import annotations

import asyncio
import copy
import random
import time
from collections.abc import Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from dart.agent.model import Policy, load_policy, save_policy
from dart.agent.prompt import blob_image_loader
from dart.blobs import BlobStore, LocalBlobStore
from dart.data.batcher import BatchPlan, build_manifest, judge_groups
from dart.data.curation import GroupProgress, GroupVerdict, Outcome
from dart.events.manifest import BatchManifest, Sample
from dart.recipe.config import Tree, make_tasks
from dart.recipe.episodes import Trajectory, evaluate, evaluate_async, rollout_groups
from dart.recipe.warmstart import Log, oracle_samples, warm_start
from dart.rollout.hf_engine import HFEngine
from dart.train.batch import micro_batches, prepare_samples
from dart.train.engine import ReferencePolicy, TorchEngine
from dart.train.update import apply_update


def outcome_of(t: Trajectory, index: int, *, update: int) -> Outcome:
    """A trajectory of update ``update`` as curation sees it (the data manager's row of it)."""
    return Outcome(rollout_id=t.rollout_id, task_id=t.task_id, group_id=t.group_id,
                   status="success" if t.reward >= 1.0 else "fail", reward=t.reward, num_steps=len(t.steps),
                   min_version=update, max_version=update, rollout_index=index)


def oracle_experience(task: dict[str, Any], group_id: str, policy: Policy, store: BlobStore, cfg: Tree, *,
                      update: int) -> tuple[Outcome, list[Sample]]:
    """The task's oracle solution as an experience-pool entry for group ``group_id`` (reward 1)."""
    rollout_id = f"oracle:{group_id}"
    steps = [replace(s, rollout_id=rollout_id, group_id=group_id, policy_version=update)
             for s in oracle_samples([task], policy, store, cfg)]
    outcome = Outcome(rollout_id=rollout_id, task_id=task["id"], group_id=group_id, status="success", reward=1.0,
                      num_steps=len(steps), min_version=update, max_version=update, origin="oracle")
    return outcome, steps


def batch_of(trajectories: Sequence[Trajectory], *, update: int, cfg: Tree, policy: Policy | None = None,
             store: BlobStore | None = None, tasks: dict[str, dict[str, Any]] | None = None) -> BatchManifest:
    """The update's batch, built by the data manager's batch assembly (:func:`dart.data.batcher.judge_groups`,
    :func:`dart.data.batcher.build_manifest`) with its settings (``cfg.data.curation``, ``.batcher``): a
    group is kept when it holds a success and a failure (``recipe.drop_uniform_groups``; off: every
    group is kept); with ``curation.inject_experience`` an all-fail group of one of ``tasks`` (the
    experience pool) gets its task's oracle solution in place of one failure (``policy`` and
    ``store`` build it)."""
    curation = cfg.data.curation
    members: dict[str, list[Trajectory]] = {}
    for t in trajectories:
        members.setdefault(t.group_id, []).append(t)
    steps = {t.rollout_id: [s for s in t.steps if s.response_token_ids] for t in trajectories}
    groups = [GroupProgress(group_id=gid, task_id=ts[0].task_id, group_size=len(ts), opened_ms=0,
                            outcomes=tuple(outcome_of(t, i, update=update) for i, t in enumerate(ts)))
              for gid, ts in members.items()]
    if not cfg.recipe.drop_uniform_groups:
        plan = BatchPlan(tuple(GroupVerdict(g.group_id, g.task_id, g.outcomes) for g in groups))
        return build_manifest(plan, steps, run_id="recipe", seq=update, curation=curation)
    pool: dict[str, list[Outcome]] = {}
    for g in groups:
        if (curation.inject_experience and tasks and g.task_id in tasks and g.task_id not in pool
                and all(o.reward is not None and o.reward < 1.0 for o in g.outcomes)):
            assert policy is not None and store is not None, "injecting experience needs the policy and the store"
            oracle, oracle_steps = oracle_experience(tasks[g.task_id], g.group_id, policy, store, cfg, update=update)
            pool[g.task_id] = [oracle]
            steps[oracle.rollout_id] = oracle_steps
    plan = judge_groups(groups, pool=pool, current_version=update, curation=curation, batcher=cfg.data.batcher)
    return build_manifest(plan, steps, run_id="recipe", seq=update, curation=curation)


def rl_update(engine: Any, ref: Any, policy: Policy, trajectories: Sequence[Trajectory], *, store: BlobStore,
              cfg: Tree, update: int, tasks: dict[str, dict[str, Any]] | None = None) -> dict[str, float]:
    """One GRPO update on the trajectories, through the trainer's own batch preparation and update
    with its settings (``cfg.trainer``)."""
    trainer = cfg.trainer
    manifest = batch_of(trajectories, update=update, cfg=cfg, policy=policy, store=store, tasks=tasks)
    if not manifest.samples:
        return {"samples": 0.0}
    kept, dropped = prepare_samples(manifest, tokenizer=policy.tokenizer,
                                    image_processor=policy.image_processor, load_image=blob_image_loader(store),
                                    prompt_cfg=trainer.prompt, check_hash=True,
                                    step_weight=trainer.loss.step_weight)
    if broken := [d for d in dropped if d.reason != "vision_token"]:
        raise RuntimeError(f"{len(broken)} samples dropped ({broken[0].reason}: {broken[0].detail}): the "
                           "trainer must rebuild the rollout prompts exactly")
    batches = micro_batches(kept, size=trainer.engine.micro_batch_samples, pad_id=policy.pad_token_id)
    policy.model.train()
    result = apply_update(engine, batches, trainer.loss, ref, epochs=trainer.ppo_epochs,
                          minibatches=trainer.ppo_minibatches)
    policy.model.eval()
    means = result.stats.means()
    return {"samples": float(result.num_samples), "grad_norm": result.grad_norm,
            "loss": means.get("loss/total", 0.0), "kl": means.get("loss/kl", 0.0),
            "entropy": means.get("entropy/mean", 0.0)}


def run_recipe(cfg: Tree, workdir: str | Path, *, log: Log = print, warm: Path | None = None) -> dict[str, Any]:
    """Build, warm-start, evaluate, train with RL, evaluate again; returns the numbers. ``cfg`` is a
    run's config tree (:class:`dart.stack.config.StackConfig`): the recipe's knobs and the services'
    settings the learner plays their part with.

    Keys: warm_success, rl_success, delta, eval_episodes, train_success (rollout success per
    update), updates (per-update stats), recipe, and wall seconds per phase (sft_s, eval_warm_s,
    rl_s, eval_rl_s, total_s). The warm start is in ``workdir/warm``, the RL policy in
    ``workdir/final``. ``warm``: start RL from this policy directory instead (no build, no SFT),
    to study RL settings on one warm start.
    """
    import torch

    recipe, trainer = cfg.recipe, cfg.trainer
    t_all = time.perf_counter()
    torch.set_num_threads(trainer.engine.threads or 1)
    torch.manual_seed(recipe.seed)
    workdir = Path(workdir)
    store = open_workdir(workdir)
    train, held_out = make_tasks(recipe)
    out: dict[str, Any] = {"eval_episodes": recipe.held_out_episodes, "recipe": asdict(recipe)}

    t0 = time.perf_counter()
    warm_dir = warm or warm_start(cfg, workdir, store, train, log)
    out["sft_s"] = elapsed(t0)
    policy = load_policy(warm_dir)
    t0 = time.perf_counter()
    out["warm_success"] = evaluate(policy, held_out, recipe.held_out_episodes, store=store, cfg=cfg, phase=1)
    out["eval_warm_s"] = elapsed(t0)
    log(f"warm start: held-out success {out['warm_success']:.3f} over {recipe.held_out_episodes} episodes "
        f"(sft {out['sft_s']} s, eval {out['eval_warm_s']} s)")

    t0 = time.perf_counter()
    engine = TorchEngine(policy.model, trainer.optim, trainer.engine)
    ref = (ReferencePolicy(copy.deepcopy(policy.model), engine.device, engine.dtype)
           if trainer.loss.kl_coef > 0 else None)
    out.update(asyncio.run(rl_phase(policy, engine, ref, train, held_out, store=store, cfg=cfg, log=log)))
    out["rl_s"] = elapsed(t0)
    save_policy(policy, workdir / "final", state=engine.full_state_dict())
    t0 = time.perf_counter()
    out["rl_success"] = evaluate(policy, held_out, recipe.held_out_episodes, store=store, cfg=cfg, phase=2)
    out["eval_rl_s"] = elapsed(t0)
    out["delta"] = out["rl_success"] - out["warm_success"]
    out["total_s"] = elapsed(t_all)
    log(f"RL: held-out success {out['rl_success']:.3f} over {recipe.held_out_episodes} episodes "
        f"(warm start {out['warm_success']:.3f}, delta {out['delta']:+.3f}; rl {out['rl_s']} s, "
        f"eval {out['eval_rl_s']} s, total {out['total_s']} s)")
    return out


async def rl_phase(policy: Policy, engine: Any, ref: Any, train: list[dict[str, Any]], held_out: list[dict[str, Any]],
                   *, store: BlobStore, cfg: Tree, log: Log) -> dict[str, Any]:
    """``recipe.updates`` GRPO updates, each on fresh rollouts of ``data.batcher.groups_per_batch``
    training tasks by the policy being trained; returns train_success, updates and held_out_curve.
    The experience pool holds the first ``experience_tasks`` training tasks' oracle solutions, as
    `dart up`'s does."""
    recipe = cfg.recipe
    rng = random.Random(recipe.seed)
    pool = {t["id"]: t for t in train[: cfg.experience_tasks]}
    out: dict[str, Any] = {"train_success": [], "updates": [], "held_out_curve": []}
    gen = HFEngine(policy, cfg.rollout.hf)
    try:
        for u in range(recipe.updates):
            tu = time.perf_counter()
            policy.model.eval()
            trajectories = await rollout_groups(gen, rng.sample(train, cfg.data.batcher.groups_per_batch),
                                                store=store, cfg=cfg, update=u)
            success = sum(t.reward >= 1.0 for t in trajectories) / len(trajectories)
            out["train_success"].append(success)
            tr = elapsed(tu)
            stats = rl_update(engine, ref, policy, trajectories, store=store, cfg=cfg, update=u, tasks=pool)
            out["updates"].append({**stats, "rollout_success": success, "rollouts_s": tr, "update_s": elapsed(tu)})
            log(f"update {u + 1}/{recipe.updates}: rollout success {success:.3f}, "
                f"{int(stats['samples'])} samples, loss {stats.get('loss', 0.0):+.4f}, "
                f"grad {stats.get('grad_norm', 0.0):.3f}, rollouts {tr} s, total {elapsed(tu)} s")
            if recipe.eval_every and (u + 1) % recipe.eval_every == 0:
                policy.model.eval()
                rate = await evaluate_async(gen, held_out, recipe.held_out_episodes, store=store, cfg=cfg, phase=2)
                out["held_out_curve"].append((u + 1, rate))
                log(f"update {u + 1}/{recipe.updates}: held-out success {rate:.3f}")
    finally:
        await gen.close()
    return out


def open_workdir(workdir: Path) -> LocalBlobStore:
    workdir.mkdir(parents=True, exist_ok=True)
    return LocalBlobStore(workdir / "blobs")


def elapsed(t0: float) -> float:
    return round(time.perf_counter() - t0, 1)
