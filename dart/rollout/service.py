"""The rollout worker: observations in, actions out, weights followed.

A member of the ``rollout`` consumer group on the observations topic. Each observation is one
policy step (:func:`dart.agent.decide.decide`: the UI-TARS prompt from the observation's context,
screenshots from the blob store; the engine's answer; its typed actions), and the reply goes to
the env worker that asked (``producer.reply(obs.reply, ActionChosen)``), every answer stamped with the
policy version that produced it. Concurrency is bounded by ``max_concurrency``; offsets are
committed only once every observation of a fetch has been answered.

Never crashes on input: a garbled model answer parses to ``InvalidAction``; a screenshot
that cannot be read or an engine failure is answered with ``finish_reason='error'`` (an
infrastructure failure for the env worker to count as such, never a model step).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time

from dart.agent.actions import InvalidAction, to_wire
from dart.agent.decide import Decision, decide, wire_actions
from dart.agent.model import load_policy
from dart.agent.prompt import blob_image_loader
from dart.blobs import BlobStore
from dart.bus import SLOW_FETCH_WAIT_MS, BusConfig, Consumer, Delivered, Producer
from dart.errors import DartError
from dart.events import ActionChosen, Event, ObservationEmitted, ParsedAction, WorkerHeartbeat
from dart.events.manifest import PromptContext
from dart.rollout.config import RolloutWorkerConfig
from dart.rollout.engine import Engine, Generation
from dart.rollout.hf_engine import HFEngine
from dart.rollout.openai_engine import OpenAIEngine
from dart.rollout.vllm_engine import VLLMEngine
from dart.rollout.weight_receive import open_receiver
from dart.rollout.weight_swap import WeightFollower

log = logging.getLogger(__name__)


def make_engine(cfg: RolloutWorkerConfig) -> Engine:
    """The engine ``cfg`` names (loads the model for hf / vllm)."""
    if cfg.engine == "openai":
        return OpenAIEngine(cfg.openai)
    if cfg.engine == "vllm":
        return VLLMEngine(cfg.model, cfg.vllm, initial_version=cfg.hf.initial_version)

    return HFEngine(load_policy(cfg.model, cfg.device, dtype=cfg.dtype), cfg.hf)


def actions_of(text: str, obs: ObservationEmitted, cfg: RolloutWorkerConfig) -> list[ParsedAction]:
    """Wire actions of a model answer, in the observation's screen pixels; never raises."""
    return wire_actions(text, screen=(obs.screen_width, obs.screen_height), convention=cfg.convention,
                        prompt=cfg.prompt)


class RolloutWorker:
    def __init__(
        self,
        cfg: RolloutWorkerConfig,
        engine: Engine,
        store: BlobStore,
        bus: BusConfig,
        *,
        producer: Producer | None = None,
    ) -> None:
        self.cfg = cfg
        self.engine = engine
        self.store = store
        self.bus = bus
        self.worker_id = cfg.worker
        self._own_producer = producer is None
        self.producer = producer or Producer(bus, client_id=self.worker_id)
        self.load_image = blob_image_loader(store)
        self.slots = asyncio.Semaphore(cfg.max_concurrency)
        self.busy = 0
        self.answered = 0
        self.follower = WeightFollower(
            engine, store, worker_id=self.worker_id, run_id=cfg.run_id, send=self._announce,
            direct=open_receiver(cfg.transfer, self.worker_id) if cfg.follow_weights else None,
        )
        self._started = time.monotonic()
        self.consumers: list[Consumer] = []
        """The consumers of :meth:`run` (observations; weights), once it started them."""

    async def _announce(self, event: Event) -> None:
        await self.producer.send(event, topic=self.bus.topics.heartbeats, key=self.worker_id.encode())

    # ------------------------------------------------------------ answering

    async def answer(self, obs: ObservationEmitted) -> ActionChosen:
        """The reply to one observation; failures become ``finish_reason='error'``, never raise."""
        try:
            decision = await decide(PromptContext.from_observation(obs), self.engine, load_image=self.load_image,
                                    prompt=self.cfg.prompt, convention=self.cfg.convention, sampling=obs.sampling,
                                    request_id=obs.event_id)
        except (DartError, OSError, ValueError, RuntimeError) as exc:
            log.error("observation %s (%s step %d): %s", obs.event_id, obs.rollout_id, obs.step_index, exc)
            return self._error_reply(obs, f"{type(exc).__name__}: {exc}")
        return self._reply(obs, decision, queue_s=decision.prompt_s + decision.generation.queue_s)

    def _error_reply(self, obs: ObservationEmitted, error: str) -> ActionChosen:
        """An infrastructure failure for the env worker to count as such, never a model step."""
        failed = Generation(text="", token_ids=[], logprobs=[], entropies=[], finish_reason="error",
                            prompt_token_ids=None, policy_version=self.engine.version)
        actions = [to_wire(InvalidAction(reason=f"rollout worker error: {error}"[:500]))]
        return self._reply(obs, Decision(generation=failed, actions=actions, prompt_hash="", prompt_s=0.0),
                           queue_s=0.0)

    def _reply(self, obs: ObservationEmitted, decision: Decision, *, queue_s: float) -> ActionChosen:
        gen = decision.generation
        return ActionChosen.new(
            run_id=obs.run_id or self.cfg.run_id,
            producer=self.worker_id,
            in_reply_to=obs.event_id,
            rollout_id=obs.rollout_id,
            request_id=obs.request_id,
            task_id=obs.task_id,
            step_index=obs.step_index,
            actions=decision.actions,
            response_text=gen.text,
            response_token_ids=gen.token_ids,
            logprobs=gen.logprobs,
            entropies=gen.entropies,
            policy_version=gen.policy_version,
            newer_version_seen=gen.newer_version_seen,
            prompt_hash=decision.prompt_hash,
            prompt_tokens=len(gen.prompt_token_ids or ()),
            finish_reason=gen.finish_reason,
            engine=self.engine.name,
            queue_s=queue_s,
            generate_s=gen.generate_s,
            sampling=obs.sampling,
        )

    async def _serve_one(self, d: Delivered) -> None:
        obs = d.event
        if not isinstance(obs, ObservationEmitted):
            log.warning("skipping a %s on %s", type(obs).__name__, d.topic)
            return
        if not obs.reply.topic:  # imported experience (an oracle's step, on the log for the record): no one asked
            return
        async with self.slots:
            self.busy += 1
            try:
                action = await self.answer(obs)
            finally:
                self.busy -= 1
        await self.producer.reply(obs.reply, action)
        self.answered += 1

    async def handle_batch(self, batch: list[Delivered]) -> None:
        """Answer a fetch of observations concurrently; returns once every reply is acknowledged
        (the consumer commits after this, so a crash before it replays them)."""
        results = await asyncio.gather(*(self._serve_one(d) for d in batch), return_exceptions=True)
        for r in results:
            if isinstance(r, BaseException):
                raise r

    async def _on_weights(self, d: Delivered) -> None:
        self.follower.offer(d.event)

    # ------------------------------------------------------------ running

    def heartbeat(self) -> WorkerHeartbeat:
        stats = self.engine.stats()
        uptime = time.monotonic() - self._started
        return WorkerHeartbeat.new(
            run_id=self.cfg.run_id,
            producer=self.worker_id,
            worker_id=self.worker_id,
            role="rollout",
            state="busy" if self.busy else "idle",
            host=socket.gethostname(),
            pid=os.getpid(),
            slots=self.cfg.max_concurrency,
            slots_busy=self.busy,
            busy_s=stats.busy_s,
            idle_s=max(0.0, uptime - stats.busy_s),
            uptime_s=uptime,
            policy_version=self.engine.version,
            metrics={"answered": float(self.answered), "batches": float(stats.batches)},
            info={"engine": self.engine.name},
        )

    async def _heartbeats(self) -> None:
        while True:
            await self._announce(self.heartbeat())
            await asyncio.sleep(self.cfg.heartbeat_s)

    async def run(self, stop: asyncio.Event | None = None) -> None:
        """Serve until ``stop`` is set; if any part fails, stop the rest and re-raise."""
        stop = stop or asyncio.Event()
        await self.engine.start()
        topics = self.bus.topics
        consumers = [
            Consumer(
                self.bus,
                topics=[topics.observations],
                group=self.cfg.group,
                batch_handler=self.handle_batch,
                producer=self.producer,
                client_id=self.worker_id,
                max_batch=4 * self.cfg.max_concurrency,
                # Fetch on while answering: an observation that arrives while the engine works
                # joins its next batch, instead of waiting for its whole fetch to be answered.
                pipeline_records=4 * self.cfg.max_concurrency,
            )
        ]
        coros = [self._heartbeats()]
        if self.cfg.follow_weights and self.cfg.engine != "openai":
            consumers.append(
                Consumer(
                    self.bus,
                    topics=[topics.weights],
                    group=WeightFollower.group_for(self.worker_id),
                    handler=self._on_weights,
                    producer=self.producer,
                    client_id=f"{self.worker_id}-weights",
                    fetch_max_wait_ms=SLOW_FETCH_WAIT_MS,  # a version every several seconds
                )
            )
            coros.append(self.follower.run())
        tasks = [asyncio.create_task(c.run(), name=f"consumer-{c.group}") for c in consumers]
        tasks += [asyncio.create_task(c, name="rollout-bg") for c in coros]
        stopper = asyncio.create_task(stop.wait(), name="stop")
        self.consumers = consumers
        try:
            done, _ = await asyncio.wait([*tasks, stopper], return_when=asyncio.FIRST_COMPLETED)
            for t in done:
                if t is not stopper and t.exception() is not None:
                    raise t.exception()  # type: ignore[misc]
        finally:
            for c in consumers:
                c.stop()
            await asyncio.wait([t for t in tasks if t.get_name().startswith("consumer")], timeout=10)
            for t in [*tasks, stopper]:
                t.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await asyncio.gather(*tasks, return_exceptions=True)
            await self.engine.close()
            if self.follower.direct is not None:
                await asyncio.to_thread(self.follower.direct.close)
            if self._own_producer:
                await asyncio.to_thread(self.producer.close)

    async def ready(self, timeout_s: float = 30.0) -> None:
        """Wait until every consumer of :meth:`run` has its partitions (for tests and demos)."""
        deadline = time.monotonic() + timeout_s
        while not self.consumers:
            if time.monotonic() > deadline:
                raise TimeoutError("rollout worker did not start its consumers")
            await asyncio.sleep(0.05)
        await asyncio.wait_for(asyncio.gather(*(c.started.wait() for c in self.consumers)), timeout_s)
