"""The env worker: N environment slots that run whole trajectories for rollout requests.

Scheduling is rollout-wise: a reader takes RolloutRequested records (consumer group
``cfg.group_name`` on the requests topic) into a bounded queue; each free slot takes the next
request at once, and no slot ever waits for another. An offset is committed only when every
request before it in its partition has finished *and* its trajectory's events were
acknowledged by the broker (:class:`~dart.bus.UnorderedConsumer`), so a killed worker's
unfinished requests are redone by another member of the group (a redo carries the same
request_id and rollout_id, so consumers can recognise it).

An environment failure (the backend raised, a health probe failed, no reply came in time) is
``infra_error``: a TrajectoryFinished without any RewardAssigned, the slot's backend is closed
and recreated, and the request is produced again with ``attempt + 1`` (at most
``max_attempts`` tries in all).

Backends come from :mod:`dart.env.backends`: one per slot, plus what the slots share (the
libvirt backend's VM pool, started before the first request and ticked with each heartbeat).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from dart.blobs import BlobStore
from dart.bus import BusConfig, Producer, ReplyInbox, Taken, UnorderedConsumer, read_topic
from dart.env.backend import EnvBackend
from dart.env.backends import backends_for
from dart.env.catalogue import TaskCatalogue
from dart.env.config import EnvWorkerConfig
from dart.env.episode import Episode, RolloutServiceActor, rollout_id_of
from dart.env.slots import SlotClock, next_attempt, trajectory_status
from dart.env.tasks import Task, load_tasks
from dart.errors import BusError
from dart.events import (
    RewardAssigned,
    RolloutRequested,
    TaskRegistered,
    TrajectoryFinished,
    TrajectoryStatus,
    WorkerHeartbeat,
    new_event_id,
    now_ms,
)

log = logging.getLogger(__name__)
EVALUATOR_VERSION = "dart-evaluators-1"


@dataclass(frozen=True, slots=True)
class _Job:
    taken: Taken
    request: RolloutRequested


class EnvWorker:
    def __init__(self, cfg: EnvWorkerConfig, bus: BusConfig, store: BlobStore, *,
                 backend_factory: Callable[[int], EnvBackend] | None = None) -> None:
        self.cfg = cfg
        self.bus = bus
        self.store = store
        self.worker_id = cfg.worker
        self.producer = Producer(bus, client_id=self.worker_id)
        self.backends = backends_for(cfg, publish=self.producer.send_nowait)
        self.factory = backend_factory or self.backends.make
        self.catalogue = TaskCatalogue([*self.backends.shipped_tasks(),
                                        *(load_tasks(cfg.task_files) if cfg.task_files else ())])
        self.requests = UnorderedConsumer(bus, topic=bus.topics.requests, group=cfg.group_name,
                                          client_id=self.worker_id, producer=self.producer, run_id=cfg.run_id,
                                          max_records=cfg.slots)
        self.assigned = self.requests.assigned
        self.clock = SlotClock(cfg.slots, time.monotonic())
        self.counts = {"trajectories": 0, "rewards": 0, "infra_errors": 0, "requeued": 0, "steps": 0, "skipped": 0}
        self._queue: asyncio.Queue[_Job] = asyncio.Queue(maxsize=cfg.slots)
        self._backends: list[EnvBackend] = [self.factory(i) for i in range(cfg.slots)]
        self.inbox = ReplyInbox(bus, self.worker_id, producer=self.producer, partition=cfg.reply_partition)

    # ------------------------------------------------------------------ running

    async def run(self, stop: asyncio.Event | None = None) -> None:
        """Serve until ``stop`` is set (or the task is cancelled). If any part fails, the rest
        stop and the error is raised: unfinished requests stay uncommitted and are redone."""
        stop = stop or asyncio.Event()
        stopper = asyncio.create_task(stop.wait())
        tasks = [asyncio.create_task(self._start())]
        try:
            await _first_to_end(tasks, stopper)  # booting a VM pool takes minutes: a stop may come first
            if not stop.is_set():
                parts = [self._read(), self.requests.commits(), self._heartbeats(), self._follow_tasks()]
                parts += [self._slot(i) for i in range(self.cfg.slots)]
                tasks = [asyncio.create_task(p) for p in parts]
                await _first_to_end(tasks, stopper)
        finally:
            for t in [*tasks, stopper]:
                t.cancel()
            await asyncio.gather(*tasks, stopper, return_exceptions=True)
            await self._shutdown()

    async def _start(self) -> None:
        # What the slots share (a VM pool) comes up before the worker joins the group, so no
        # request is taken that no environment could serve yet.
        await self.backends.start()
        await self.inbox.start()
        await self.requests.start()

    async def ready(self, timeout_s: float = 30.0) -> None:
        """Wait until the worker owns request partitions (for tests and demos)."""
        await asyncio.wait_for(self.assigned.wait(), timeout_s)

    async def _shutdown(self) -> None:
        with contextlib.suppress(Exception):
            await self._send(self.heartbeat(state="stopped"))
        await self.requests.stop()  # leaves the group: the others take over at once
        await self.inbox.close()
        await asyncio.gather(*(self._close(b) for b in self._backends))  # slots give their VMs back ...
        try:
            await asyncio.wait_for(self.backends.close(), self.cfg.close_timeout_s)  # ... before the pool goes
        except Exception as exc:
            log.warning("%s: closing the shared backend failed: %s: %s", self.worker_id, type(exc).__name__, exc)
        await asyncio.to_thread(self.producer.close)

    # ------------------------------------------------------------------ reading

    async def _read(self) -> None:
        while True:
            for taken in await self.requests.take():
                job = self._job_of(taken)
                if job is None:
                    self.requests.done(taken)
                else:
                    await self._queue.put(job)  # bounded: a full queue stops the reading

    def _job_of(self, taken: Taken) -> _Job | None:
        event = taken.delivered.event
        if not isinstance(event, RolloutRequested) or event.backend != self.cfg.backend:
            self.counts["skipped"] += 1
            return None
        log.debug("%s: request %s (attempt %d) from %d@%d", self.worker_id, event.request_id, event.attempt,
                  taken.partition, taken.offset)
        return _Job(taken, event)

    # ------------------------------------------------------------------ slots

    async def _slot(self, slot: int) -> None:
        while True:
            job = await self._queue.get()
            if not self.requests.current(job.taken):
                continue  # its partition was reassigned while it waited
            self.clock.begin(slot, time.monotonic())
            try:
                await self._serve(slot, job.request)
            finally:
                self.clock.end(slot, time.monotonic())
            self.requests.done(job.taken)

    async def _serve(self, slot: int, req: RolloutRequested) -> None:
        """Run one request to its durable end: results acknowledged, or a re-queue."""
        try:
            task = await self.catalogue.get(req.task_id, self.cfg.task_wait_s)
        except KeyError as exc:
            log.error("%s: request %s: %s", self.worker_id, req.request_id, exc)
            await self._infra_error(slot, req, None, f"unknown task: {exc}", recycle=False)
            return
        backend = self._backends[slot]
        health = await backend.health()
        if not health.ok:
            log.warning("%s slot %d: unhealthy before %s (%s); recycling", self.worker_id, slot, req.request_id,
                        health.detail)
            backend = await self._recycle(slot)
        ep = Episode(task=task, instruction=task.instruction, backend=backend, max_steps=req.max_steps)
        actor = RolloutServiceActor(req=req, slot=slot, worker_id=self.worker_id, run_id=self.cfg.run_id,
                                    producer=self.producer, inbox=self.inbox, reply_timeout_s=self.cfg.reply_timeout_s)
        try:
            await ep.run(actor, store=self.store)
        except (asyncio.CancelledError, BusError):
            raise  # not the environment's fault: stop, and let the request be redone
        except Exception as exc:
            log.warning("%s slot %d: %s failed: %s: %s", self.worker_id, slot, actor.rollout_id, type(exc).__name__,
                        exc)
            await self._infra_error(slot, req, ep, f"{type(exc).__name__}: {exc}", recycle=True)
            return
        await self._finished(req, slot, task, ep)
        await self.backends.finished(backend)

    async def _finished(self, req: RolloutRequested, slot: int, task: Task, ep: Episode) -> None:
        assert ep.score is not None
        status = trajectory_status(reward=ep.score, ran_out=ep.ran_out, success_threshold=self.cfg.success_threshold)
        self.counts["steps"] += ep.num_steps
        await self._send(self._trajectory(req, slot, status, ep))
        await self._send(RewardAssigned.new(
            run_id=self.cfg.run_id, producer=self.worker_id, rollout_id=rollout_id_of(req), task_id=req.task_id,
            group_id=req.group_id, reward=float(ep.score), evaluator="+".join(task.evaluator.funcs),
            evaluator_version=EVALUATOR_VERSION,
            details=json.dumps({**ep.details, "invalid_steps": ep.invalid_steps}, default=str),
        ))
        self.counts["trajectories"] += 1
        self.counts["rewards"] += 1

    async def _infra_error(self, slot: int, req: RolloutRequested, ep: Episode | None, error: str, *,
                           recycle: bool) -> None:
        # The redo is produced before the failure report, so whoever reads the report can
        # already see that the request was taken care of.
        self.counts["infra_errors"] += 1
        attempt = next_attempt(req.attempt, self.cfg.max_attempts) if self.cfg.requeue else None
        if attempt is not None:
            redo = dataclasses.replace(req, event_id=new_event_id(), event_time=now_ms(), producer=self.worker_id,
                                       attempt=attempt)
            await self._send(redo, topic=self.bus.topics.requests)
            self.counts["requeued"] += 1
        if ep is not None:
            ep.finish_reason = "infra_error"
            self.counts["steps"] += ep.num_steps
        await self._send(self._trajectory(req, slot, TrajectoryStatus.INFRA_ERROR, ep, error=error[:2000]))
        self.counts["trajectories"] += 1
        if recycle:
            await self._recycle(slot)

    def _trajectory(self, req: RolloutRequested, slot: int, status: TrajectoryStatus, ep: Episode | None, *,
                    error: str | None = None) -> TrajectoryFinished:
        return TrajectoryFinished.new(
            run_id=self.cfg.run_id, producer=self.worker_id, rollout_id=rollout_id_of(req), request_id=req.request_id,
            task_id=req.task_id, group_id=req.group_id, rollout_index=req.rollout_index, status=status,
            finish_reason=ep.finish_reason if ep else "infra_error", num_steps=ep.num_steps if ep else 0,
            max_steps=req.max_steps, step_policy_versions=list(ep.versions) if ep else [], error=error,
            attempt=req.attempt, mode=req.mode, origin="online", env_worker=self.worker_id, slot=slot,
            reset_s=ep.reset_s if ep else 0.0, env_s=ep.env_s if ep else 0.0,
            policy_wait_s=ep.policy_wait_s if ep else 0.0, eval_s=ep.eval_s if ep else 0.0,
            started_at=ep.started_at if ep else now_ms(),
        )

    async def _recycle(self, slot: int) -> EnvBackend:
        await self._close(self._backends[slot])
        self._backends[slot] = self.factory(slot)
        return self._backends[slot]

    async def _close(self, backend: EnvBackend) -> None:
        try:
            await asyncio.wait_for(backend.close(), self.cfg.close_timeout_s)
        except Exception as exc:  # a backend that cannot even close is abandoned, not fatal
            log.warning("%s: closing a backend failed: %s: %s", self.worker_id, type(exc).__name__, exc)

    # ------------------------------------------------------------------ background

    async def _follow_tasks(self) -> None:
        async for d in read_topic(self.bus, self.bus.topics.tasks, follow=True):
            if isinstance(d.event, TaskRegistered):
                await self.catalogue.add_event(d.event)
        await asyncio.Event().wait()  # no tasks topic: nothing to follow, but keep running

    async def _heartbeats(self) -> None:
        while True:
            await self._send(self.heartbeat())
            await self.backends.tick()  # libvirt: every VM's record, and probes of the idle ones
            await asyncio.sleep(self.cfg.heartbeat_s)

    def heartbeat(self, state: str = "running") -> WorkerHeartbeat:
        now = time.monotonic()
        busy, idle = self.clock.totals(now)
        return WorkerHeartbeat.new(
            run_id=self.cfg.run_id, producer=self.worker_id, worker_id=self.worker_id, role="env", state=state,
            host=socket.gethostname(), pid=os.getpid(), slots=self.cfg.slots, slots_busy=self.clock.busy_slots,
            busy_s=busy, idle_s=idle, uptime_s=now - self.clock.start,
            metrics={k: float(v) for k, v in self.counts.items()} | {"queued": float(self._queue.qsize())},
            info={"backend": self.cfg.backend, "group": self.cfg.group_name},
        )

    async def _send(self, event: Any, **kw: Any) -> None:
        await self.producer.send(event, **kw)


async def _first_to_end(tasks: list[asyncio.Task[Any]], stopper: asyncio.Task[Any]) -> None:
    """Wait until one of ``tasks`` ends or ``stopper`` does; raise the error a task ended with."""
    done, _ = await asyncio.wait([*tasks, stopper], return_when=asyncio.FIRST_COMPLETED)
    for t in done:
        if t is not stopper and not t.cancelled() and t.exception() is not None:
            raise t.exception()  # type: ignore[misc]
