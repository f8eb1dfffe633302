"""One trajectory of one rollout request, on one env slot:

    reset -> (screenshot -> blob store -> ObservationEmitted -> wait for ActionChosen
              -> execute its actions)* -> evaluate

The loop stops at the agent's ``finished`` / ``call_user``, when the environment reports
``info["done"]`` (a synthetic submit button), or after ``max_steps`` policy turns. A garbled
answer is an InvalidAction step: nothing is executed, the step counts, the trajectory goes on.
Whatever the backend raises, and a reply that does not come in time, propagates to the
caller, which ends the trajectory as ``infra_error``; :class:`Episode` keeps what happened so
far (steps, versions, timings) for that report.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

from dart.agent.actions import TERMINAL_KINDS, Action, InvalidAction, from_wire
from dart.blobs import BlobStore
from dart.env.backend import EnvBackend, Observation
from dart.env.tasks import Task
from dart.events import ActionChosen, HistoryTurn, ObservationEmitted, ReplyRoute, RolloutRequested, now_ms


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


@dataclass
class Episode:
    """The run of one request on one backend; its fields are the progress so far."""

    req: RolloutRequested
    task: Task
    backend: EnvBackend
    slot: int
    worker_id: str
    run_id: str
    reply_timeout_s: float
    started_at: int = field(default_factory=now_ms)
    num_steps: int = 0
    versions: list[int] = field(default_factory=list)
    history: list[HistoryTurn] = field(default_factory=list)
    invalid_steps: int = 0
    final_action: Action | None = None
    finish_reason: str = "max_steps"
    reset_s: float = 0.0
    env_s: float = 0.0
    policy_wait_s: float = 0.0
    eval_s: float = 0.0
    score: float | None = None
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def rollout_id(self) -> str:
        return rollout_id_of(self.req)

    @property
    def ran_out(self) -> bool:
        return self.finish_reason == "max_steps"

    async def run(self, *, producer: Sender, inbox: Inbox, store: BlobStore) -> None:
        """Play the trajectory and score it (sets ``score`` and ``details``)."""
        t = time.monotonic()
        obs = await self.backend.reset(self.task)
        self.reset_s = time.monotonic() - t
        while self.num_steps < self.req.max_steps:
            reply = await self._ask(obs, producer=producer, inbox=inbox, store=store)
            t = time.monotonic()
            obs, ended = await self._execute(reply, obs)
            self.env_s += time.monotonic() - t
            if ended:
                break
        t = time.monotonic()
        self.score, self.details = await self.backend.evaluate(self.task, final_action=self.final_action)
        self.eval_s = time.monotonic() - t

    async def _ask(self, obs: Observation, *, producer: Sender, inbox: Inbox, store: BlobStore) -> ActionChosen:
        digest = await asyncio.to_thread(store.put, obs.screenshot_png)
        req = self.req
        event = ObservationEmitted.new(
            run_id=self.run_id, producer=self.worker_id,
            rollout_id=self.rollout_id, request_id=req.request_id, task_id=req.task_id, group_id=req.group_id,
            step_index=self.num_steps, instruction=self.task.instruction, screenshot_digest=digest,
            screen_width=obs.width, screen_height=obs.height, history=list(self.history), reply=inbox.route,
            sampling=req.sampling.at_step(self.num_steps), max_steps=req.max_steps, mode=req.mode, env_worker=self.worker_id,
            slot=self.slot,
        )
        inbox.expect(event.event_id)  # before sending: an answer can beat our own ack
        await producer.send(event)
        t = time.monotonic()
        try:
            reply = await inbox.wait(event.event_id, self.reply_timeout_s)
        except TimeoutError as exc:
            raise ReplyTimeout(
                f"no action for step {self.num_steps} of {self.rollout_id} within {self.reply_timeout_s} s "
                "(are rollout workers running? raise reply_timeout_s for slow policies)"
            ) from exc
        finally:
            self.policy_wait_s += time.monotonic() - t
        self.versions.append(int(reply.policy_version))
        self.history.append(
            HistoryTurn(step_index=self.num_steps, screenshot_digest=digest, response_text=reply.response_text)
        )
        self.num_steps += 1
        return reply

    async def _execute(self, reply: ActionChosen, obs: Observation) -> tuple[Observation, bool]:
        """Run the reply's actions; (latest observation, whether the trajectory ended)."""
        actions = [from_wire(p) for p in reply.actions] or [InvalidAction(reason="no action in the answer")]
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
