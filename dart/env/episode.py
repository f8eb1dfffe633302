"""One trajectory of one task on one backend, the only episode loop of dart:

    reset -> (screenshot -> blob store -> actor: a policy step -> execute its actions)* -> evaluate

It runs over two ports: an environment backend (:class:`~dart.env.backend.EnvBackend`) and an
:class:`Actor`, which answers a step's :class:`~dart.events.manifest.PromptContext`. The env
worker's actor is :class:`RolloutServiceActor`, which asks the rollout service over the bus
(ObservationEmitted out, ActionChosen back); the one-process recipe's is
:class:`dart.agent.decide.EngineActor`, which calls an engine in process. Both answers are one
:func:`dart.agent.decide.decide`.

The loop stops at the agent's ``finished`` / ``call_user``, when the environment reports
``info["done"]`` (a synthetic submit button), or after ``max_steps`` policy turns. A garbled
answer is an InvalidAction step: nothing is executed, the step counts, the trajectory goes on.
Whatever the backend or the actor raises (a reply that does not come in time:
:class:`ReplyTimeout`) propagates to the caller, which ends the trajectory as ``infra_error``;
:class:`Episode` keeps what happened so far (steps, versions, timings) for that report.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from dart.agent.actions import TERMINAL_KINDS, Action, InvalidAction, from_wire
from dart.blobs import BlobStore
from dart.env.backend import EnvBackend, Observation
from dart.events import (
    ActionChosen,
    HistoryTurn,
    ObservationEmitted,
    ParsedAction,
    ReplyRoute,
    RolloutRequested,
    now_ms,
)
from dart.events.manifest import PromptContext


class Answer(Protocol):
    """What the loop reads of an actor's answer (``ActionChosen`` and ``Decision`` have it)."""

    @property
    def actions(self) -> Sequence[ParsedAction]: ...

    @property
    def response_text(self) -> str: ...

    @property
    def policy_version(self) -> int: ...


class Actor(Protocol):
    """The policy side of an episode: one answer per step."""

    async def act(self, ctx: PromptContext) -> Answer: ...


@dataclass
class Episode:
    """The run of one task on one backend; its fields are the progress so far."""

    task: Any
    """What ``backend.reset`` and ``backend.evaluate`` take (a :class:`~dart.env.tasks.Task`; a
    synthetic task's dict in the one-process recipe)."""
    instruction: str
    backend: EnvBackend
    max_steps: int
    started_at: int = field(default_factory=now_ms)
    num_steps: int = 0
    versions: list[int] = field(default_factory=list)
    history: list[HistoryTurn] = field(default_factory=list)
    invalid_steps: int = 0
    final_action: Action | None = None
    finish_reason: str = "max_steps"
    """env_done | finished | call_user | max_steps (the env worker adds infra_error)."""
    reset_s: float = 0.0
    env_s: float = 0.0
    policy_wait_s: float = 0.0
    eval_s: float = 0.0
    score: float | None = None
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def ran_out(self) -> bool:
        return self.finish_reason == "max_steps"

    async def run(self, actor: Actor, *, store: BlobStore) -> None:
        """Play the trajectory and score it (sets ``score`` and ``details``)."""
        t = time.monotonic()
        obs = await self.backend.reset(self.task)
        self.reset_s = time.monotonic() - t
        while self.num_steps < self.max_steps:
            answer = await self._ask(actor, obs, store)
            t = time.monotonic()
            obs, ended = await self._execute(answer, obs)
            self.env_s += time.monotonic() - t
            if ended:
                break
        t = time.monotonic()
        self.score, self.details = await self.backend.evaluate(self.task, final_action=self.final_action)
        self.eval_s = time.monotonic() - t

    async def _ask(self, actor: Actor, obs: Observation, store: BlobStore) -> Answer:
        digest = await asyncio.to_thread(store.put, obs.screenshot_png)
        ctx = PromptContext(instruction=self.instruction, step_index=self.num_steps, screenshot_digest=digest,
                            screen_width=obs.width, screen_height=obs.height, history=list(self.history))
        t = time.monotonic()
        try:
            answer = await actor.act(ctx)
        finally:
            self.policy_wait_s += time.monotonic() - t
        self.versions.append(int(answer.policy_version))
        self.history.append(
            HistoryTurn(step_index=self.num_steps, screenshot_digest=digest, response_text=answer.response_text)
        )
        self.num_steps += 1
        return answer

    async def _execute(self, answer: Answer, obs: Observation) -> tuple[Observation, bool]:
        """Run the answer's actions; (latest observation, whether the trajectory ended)."""
        actions = [from_wire(p) for p in answer.actions] or [InvalidAction(reason="no action in the answer")]
        executed = 0
        for action in actions:
            if isinstance(action, InvalidAction):
                continue  # model text that is not an action: a step that does nothing
            if action.kind in TERMINAL_KINDS:
                self.final_action = action
                self.finish_reason = action.kind
                return obs, True
            obs = await self.backend.step(action)
            executed += 1
            if obs.info.get("done"):
                self.finish_reason = "env_done"
                return obs, True
        if executed == 0:
            self.invalid_steps += 1
        return obs, False


# ---------------------------------------------------------------- the actor of the env worker


class Sender(Protocol):
    async def send(self, event: Any, **kw: Any) -> Any: ...


class Inbox(Protocol):
    @property
    def route(self) -> ReplyRoute: ...

    def expect(self, correlation_id: str) -> Any: ...

    async def wait(self, correlation_id: str, timeout_s: float) -> Any: ...


class ReplyTimeout(TimeoutError):
    """No ActionChosen arrived for an observation in time (the policy side is gone or stuck)."""


def rollout_id_of(req: RolloutRequested) -> str:
    """One id per attempt of a request: a redo after an infra error is a new rollout."""
    return f"{req.request_id}.{req.attempt}"


@dataclass(frozen=True, kw_only=True)
class RolloutServiceActor:
    """Asks the rollout service: each step is an ObservationEmitted of request ``req`` whose
    ActionChosen comes back to ``inbox`` within ``reply_timeout_s``."""

    req: RolloutRequested
    slot: int
    worker_id: str
    run_id: str
    producer: Sender
    inbox: Inbox
    reply_timeout_s: float

    @property
    def rollout_id(self) -> str:
        return rollout_id_of(self.req)

    async def act(self, ctx: PromptContext) -> ActionChosen:
        req = self.req
        event = ObservationEmitted.new(
            run_id=self.run_id, producer=self.worker_id,
            rollout_id=self.rollout_id, request_id=req.request_id, task_id=req.task_id, group_id=req.group_id,
            step_index=ctx.step_index, instruction=ctx.instruction, screenshot_digest=ctx.screenshot_digest,
            screen_width=ctx.screen_width, screen_height=ctx.screen_height, history=list(ctx.history),
            reply=self.inbox.route, sampling=req.sampling.at_step(ctx.step_index), max_steps=req.max_steps,
            mode=req.mode, env_worker=self.worker_id, slot=self.slot,
        )
        self.inbox.expect(event.event_id)  # before sending: an answer can beat our own ack
        await self.producer.send(event)
        try:
            reply: ActionChosen = await self.inbox.wait(event.event_id, self.reply_timeout_s)
        except TimeoutError as exc:
            raise ReplyTimeout(
                f"no action for step {ctx.step_index} of {self.rollout_id} within {self.reply_timeout_s} s "
                "(are rollout workers running? raise reply_timeout_s for slow policies)"
            ) from exc
        return reply
