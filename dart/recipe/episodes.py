"""Episodes of the one-process recipe: the env worker's episode loop with the policy in process.

An episode is :class:`dart.env.episode.Episode` (the one episode loop) on a synthetic backend,
its actor a :class:`dart.agent.decide.EngineActor` over an inference engine: every turn is the
rollout worker's policy step (:func:`dart.agent.decide.decide`) without the bus. Used by the
warm start's checks, held-out evaluation and the one-process learner (:mod:`dart.recipe.learn`).
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dart.agent.decide import EngineActor, Generator
from dart.agent.prompt import blob_image_loader
from dart.blobs import BlobStore
from dart.config import progress
from dart.data.rows import masked_mean
from dart.env.episode import Episode
from dart.env.synthetic import SyntheticBackend
from dart.events import Sampling
from dart.events.manifest import Sample
from dart.rollout.hf_engine import HFEngine

if TYPE_CHECKING:
    from dart.agent.model import Policy
    from dart.recipe.config import Tree


@dataclass(frozen=True, kw_only=True)
class Trajectory:
    task_id: str
    group_id: str
    rollout_id: str
    steps: list[Sample]
    """Each turn as the data manager's projection holds it (what the batch builder takes)."""
    reward: float
    finish_reason: str
    """env_done | finished | call_user | max_steps (as ``Episode.finish_reason``)."""


def eval_schedule(tasks: Sequence[dict[str, Any]], episodes: int) -> list[dict[str, Any]]:
    """``episodes`` tasks cycling through ``tasks`` in order (every task once before repeats)."""
    if not tasks:
        raise ValueError("no evaluation tasks")
    return [tasks[i % len(tasks)] for i in range(episodes)]


def sampling_seed(*parts: int) -> int:
    """A distinct 31-bit sampling seed per (phase, update, episode, step) key; the same key
    gives the same seed (never one fixed seed for every request)."""
    return random.Random(":".join(map(str, parts))).getrandbits(31)


async def run_episode(engine: Generator, task: dict[str, Any], *, store: BlobStore, cfg: Tree,
                      sampling: Callable[[int], Sampling], group_id: str, rollout_id: str) -> Trajectory:
    """One trajectory of ``task`` as the run's rollout workers play it (their prompt and convention,
    the data manager's step cap); ``sampling(i)`` gives turn i's sampling parameters."""
    actor = EngineActor(engine, load_image=blob_image_loader(store), prompt=cfg.rollout.prompt,
                        convention=cfg.rollout.convention, sampling=sampling)
    backend = SyntheticBackend()
    episode = Episode(task=task, instruction=task["instruction"], backend=backend,
                      max_steps=cfg.data.curation.max_steps)
    try:
        await episode.run(actor, store=store)
    finally:
        await backend.close()
    steps = [Sample(rollout_id=rollout_id, step_index=ctx.step_index, task_id=task["id"], group_id=group_id,
                    context=ctx, prompt_hash=d.prompt_hash, response_token_ids=list(d.generation.token_ids),
                    rollout_logprobs=list(d.generation.logprobs), entropies=list(d.generation.entropies),
                    mean_entropy=masked_mean(d.generation.entropies, len(d.generation.token_ids)),
                    policy_version=d.policy_version)
             for ctx, d in actor.turns]
    return Trajectory(task_id=task["id"], group_id=group_id, rollout_id=rollout_id, steps=steps,
                      reward=float(episode.score or 0.0), finish_reason=episode.finish_reason)


async def evaluate_async(engine: Generator, tasks: Sequence[dict[str, Any]], episodes: int, *, store: BlobStore,
                         cfg: Tree, phase: int = 0, outcomes: list[tuple[dict[str, Any], bool]] | None = None
                         ) -> float:
    """Held-out success rate over ``episodes`` concurrent episodes (tasks cycled) at the eval temperature;
    ``outcomes``, when given, gets each episode's (task, solved)."""
    def sampling_of(e: int) -> Callable[[int], Sampling]:
        return lambda i: Sampling(temperature=cfg.recipe.eval_temperature, top_p=1.0,
                                  max_new_tokens=cfg.data.scheduler.max_new_tokens,
                                  seed=sampling_seed(cfg.recipe.seed, phase, e, i))

    schedule = eval_schedule(tasks, episodes)
    bar = progress(total=len(schedule), desc="evaluation", unit="episode")

    async def counted(episode: Awaitable[Trajectory]) -> Trajectory:
        try:
            return await episode
        finally:
            bar.update(1)

    trajectories = await asyncio.gather(*(
        counted(run_episode(engine, task, store=store, cfg=cfg, sampling=sampling_of(e), group_id=f"eval:{e}",
                            rollout_id=f"eval:{phase}:{e}"))
        for e, task in enumerate(schedule)))
    bar.close()
    if outcomes is not None:
        outcomes.extend((task, t.reward >= 1.0) for task, t in zip(schedule, trajectories, strict=True))
    return sum(t.reward >= 1.0 for t in trajectories) / len(trajectories)


def success_by_instruction(outcomes: Sequence[tuple[dict[str, Any], bool]], *, min_tasks: int = 5
                           ) -> dict[str, tuple[int, float]]:
    """Success per instruction that at least ``min_tasks`` distinct tasks share: {instruction: (tasks,
    rate over its episodes)}, most tasks first. Tells which skills a policy has (on ``tiny``: which
    colours it reads); instructions of one or a few tasks each (``chain``, OSWorld) give nothing."""
    episodes: dict[str, list[bool]] = {}
    tasks: dict[str, set[str]] = {}
    for task, solved in outcomes:
        instruction = str(task.get("instruction", ""))
        episodes.setdefault(instruction, []).append(solved)
        tasks.setdefault(instruction, set()).add(str(task.get("id")))
    shared = [ins for ins in episodes if len(tasks[ins]) >= min_tasks]
    return {ins: (len(tasks[ins]), sum(episodes[ins]) / len(episodes[ins]))
            for ins in sorted(shared, key=lambda i: (-len(tasks[i]), i))}


def evaluate(policy: Policy, tasks: Sequence[dict[str, Any]], episodes: int, *, store: BlobStore,
             cfg: Tree, phase: int = 0, outcomes: list[tuple[dict[str, Any], bool]] | None = None) -> float:
    """:func:`evaluate_async` with a fresh ``hf`` engine over ``policy`` (blocking)."""
    async def main() -> float:
        # the rollout workers' engine settings, their torch threads included: `dart up` evaluating a
        # given warm start (no SFT before it to set them) ran on torch's default of one thread per
        # core, and on a loaded 2-core machine its threads fought over the cores: minutes where one
        # thread takes seconds
        engine = HFEngine(policy, cfg.rollout.hf)
        try:
            return await evaluate_async(engine, tasks, episodes, store=store, cfg=cfg, phase=phase,
                                        outcomes=outcomes)
        finally:
            await engine.close()

    policy.model.eval()
    return asyncio.run(main())


async def rollout_groups(engine: Generator, tasks: Sequence[dict[str, Any]], *, store: BlobStore, cfg: Tree,
                         update: int) -> list[Trajectory]:
    """``data.curation.n_default`` concurrent rollouts of each task (a GRPO group per task), sampled
    as the data manager asks (``data.scheduler``)."""
    scheduler = cfg.data.scheduler

    def sampling_of(k: int, r: int) -> Callable[[int], Sampling]:
        return lambda i: Sampling(temperature=scheduler.temperature, top_p=scheduler.top_p,
                                  max_new_tokens=scheduler.max_new_tokens,
                                  seed=sampling_seed(cfg.recipe.seed, 1000 + update, k, r, i))

    return list(await asyncio.gather(*(
        run_episode(engine, task, store=store, cfg=cfg, sampling=sampling_of(k, r),
                    group_id=f"u{update}:g{k}", rollout_id=f"u{update}:g{k}:r{r}")
        for k, task in enumerate(tasks) for r in range(cfg.data.curation.n_default))))
