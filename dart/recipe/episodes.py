"""In-process synthetic episodes with an inference engine: the env worker's loop without the bus.

An episode follows :class:`dart.env.episode.Episode`: reset, then per turn the screenshot goes
to the blob store, the prompt is built from it and the history (``dart.agent.prompt``, as
the rollout worker builds it), the engine answers, the answer is parsed in the rollout
worker's frame, and its actions run until the screen reports ``done`` or a terminal action
comes; at most ``max_steps`` turns; then the task's own evaluator scores it. Used by the
learnability recipe (:mod:`dart.recipe.config`) for held-out evaluation and RL rollouts.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from dart.agent.actions import TERMINAL_KINDS, Action, InvalidAction
from dart.agent.prompt import blob_image_loader, build_messages, prompt_hash
from dart.agent.uitars import parse_actions
from dart.blobs import BlobStore
from dart.env.synthetic import SyntheticBackend
from dart.events import HistoryTurn, Sampling
from dart.events.manifest import PromptContext

if TYPE_CHECKING:
    from dart.agent.model import Policy
    from dart.recipe.config import Recipe
    from dart.rollout.engine import GenerateRequest, Generation


class Answerer(Protocol):
    """What an episode needs of an engine (``dart.rollout.engine.Engine`` has it)."""

    async def generate(self, request: GenerateRequest) -> Generation: ...


@dataclass(frozen=True, kw_only=True)
class Step:
    context: PromptContext
    prompt_hash: str
    token_ids: list[int]
    logprobs: list[float]
    entropies: list[float]
    text: str


@dataclass(frozen=True, kw_only=True)
class Trajectory:
    task_id: str
    group_id: str
    rollout_id: str
    steps: list[Step]
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


async def run_episode(engine: Answerer, task: dict[str, Any], *, store: BlobStore, recipe: Recipe,
                      sampling: Callable[[int], Sampling], group_id: str, rollout_id: str) -> Trajectory:
    """One trajectory of ``task``; ``sampling(i)`` gives turn i's sampling parameters."""
    from dart.rollout.engine import GenerateRequest

    load = blob_image_loader(store)
    backend = SyntheticBackend()
    obs = await backend.reset(task)
    history: list[HistoryTurn] = []
    steps: list[Step] = []
    final: Action | None = None
    reason = "max_steps"
    while len(steps) < recipe.max_steps and reason == "max_steps":
        i = len(steps)
        digest = store.put(obs.screenshot_png)
        ctx = PromptContext(instruction=task["instruction"], step_index=i, screenshot_digest=digest,
                            screen_width=obs.width, screen_height=obs.height, history=list(history))
        messages, images = build_messages(ctx, load, recipe.prompt)
        gen = await engine.generate(GenerateRequest(messages=messages, images=images, sampling=sampling(i)))
        steps.append(Step(context=ctx, prompt_hash=prompt_hash(gen.prompt_token_ids or []),
                          token_ids=list(gen.token_ids), logprobs=list(gen.logprobs),
                          entropies=list(gen.entropies), text=gen.text))
        history.append(HistoryTurn(step_index=i, screenshot_digest=digest, response_text=gen.text))
        actions = parse_actions(gen.text, screen=(obs.width, obs.height), convention=recipe.convention,
                                min_pixels=recipe.prompt.min_pixels, max_pixels=recipe.prompt.max_pixels)
        for action in actions:
            if isinstance(action, InvalidAction):
                continue  # model text that is not an action: the turn does nothing
            if action.kind in TERMINAL_KINDS:
                final, reason = action, action.kind
                break
            obs = await backend.step(action)
            if obs.info.get("done"):
                reason = "env_done"
                break
    score, _ = await backend.evaluate(task, final_action=final)
    await backend.close()
    return Trajectory(task_id=task["id"], group_id=group_id, rollout_id=rollout_id, steps=steps,
                      reward=float(score), finish_reason=reason)


async def evaluate_async(engine: Answerer, tasks: Sequence[dict[str, Any]], episodes: int, *, store: BlobStore,
                         recipe: Recipe, phase: int = 0, outcomes: list[tuple[dict[str, Any], bool]] | None = None
                         ) -> float:
    """Held-out success rate over ``episodes`` concurrent episodes (tasks cycled) at the eval temperature;
    ``outcomes``, when given, gets each episode's (task, solved)."""
    def sampling_of(e: int) -> Callable[[int], Sampling]:
        return lambda i: Sampling(temperature=recipe.eval_temperature, top_p=1.0,
                                  max_new_tokens=recipe.max_new_tokens, seed=sampling_seed(recipe.seed, phase, e, i))

    schedule = eval_schedule(tasks, episodes)
    trajectories = await asyncio.gather(*(
        run_episode(engine, task, store=store, recipe=recipe, sampling=sampling_of(e), group_id=f"eval:{e}",
                    rollout_id=f"eval:{phase}:{e}")
        for e, task in enumerate(schedule)))
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
             recipe: Recipe, phase: int = 0, outcomes: list[tuple[dict[str, Any], bool]] | None = None) -> float:
    """:func:`evaluate_async` with a fresh ``hf`` engine over ``policy`` (blocking)."""
    from dart.rollout.hf_engine import HFEngine, HFEngineConfig

    async def main() -> float:
        engine = HFEngine(policy, HFEngineConfig(max_batch_size=recipe.engine_batch))
        try:
            return await evaluate_async(engine, tasks, episodes, store=store, recipe=recipe, phase=phase,
                                        outcomes=outcomes)
        finally:
            await engine.close()

    policy.model.eval()
    return asyncio.run(main())


async def rollout_groups(engine: Answerer, tasks: Sequence[dict[str, Any]], *, store: BlobStore, recipe: Recipe,
                         update: int) -> list[Trajectory]:
    """``group_size`` concurrent rollouts of each task at the rollout temperature (a GRPO group per task)."""
    def sampling_of(k: int, r: int) -> Callable[[int], Sampling]:
        return lambda i: Sampling(temperature=recipe.temperature, top_p=recipe.top_p,
                                  max_new_tokens=recipe.max_new_tokens,
                                  seed=sampling_seed(recipe.seed, 1000 + update, k, r, i))

    return list(await asyncio.gather(*(
        run_episode(engine, task, store=store, recipe=recipe, sampling=sampling_of(k, r),
                    group_id=f"u{update}:g{k}", rollout_id=f"u{update}:g{k}:r{r}")
        for k, task in enumerate(tasks) for r in range(recipe.group_size))))
