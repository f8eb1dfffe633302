"""The data manager shell: consume every topic into the projection, schedule rollouts,
assemble batches, serve SQL. Decisions live in the pure modules; this file does I/O.

Supervised: the consumer, the scheduler loop, the batcher loop and the SQL server run in one
TaskGroup, so a crash in one stops the others and ``run()`` raises (the process exits
non-zero) instead of limping on.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

from dart.blobs import BlobStore
from dart.bus import BusConfig, Consumer, Producer, read_topic
from dart.data import avroload, projection
from dart.data.batcher import build_manifest, plan_batch
from dart.data.config import DataConfig
from dart.data.coupled import RoundPlan, plan_round
from dart.data.http import SqlServer
from dart.data.rule_inputs import Horizon, SlowStats, batch_inputs, round_inputs, schedule_inputs
from dart.data.scheduler import Plan, PlannedRequest, plan_requests, refill_time
from dart.data.store import AsyncStore, Store, http_file
from dart.errors import DecodeError
from dart.events import BatchAssembled, RolloutRequested, Sampling

log = logging.getLogger(__name__)

CATCH_UP_IDLE_S = 5.0
"""Failing the consumer's own end-of-log signal, the projection counts as caught up once no
record arrived for this long after the join (a loaded machine can take seconds to fetch)."""
CATCH_UP_MAX_S = 120.0
# On stop: let the decision in hand finish, then project until the consumer has fetched to the end
# of the log as it was then (at most DRAIN_MAX_S in all).
DRAIN_MAX_S = 20.0
HORIZON_SAVE_MS = 30_000
"""How often the curation horizon is written to the store (any saved one stays valid; a newer one
makes a restart's first pass read less)."""
CYCLES_KEPT = 5
"""The scheduler's cycle is the median of this many latest times between its passes' plans."""
USAGE_LOG_S = 60.0
"""Seconds between two data manager lines on what its store thread did."""


def now_ms() -> int:
    return int(time.time() * 1000)


def _clock(ms: int) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(ms / 1000)) if ms else "the start"


class DataManager:
    def __init__(self, cfg: DataConfig, bus: BusConfig, *, store: Store, blobs: BlobStore,
                 producer: Producer | None = None, seed: int | None = None) -> None:
        self.cfg = cfg
        self.bus = bus
        self.store = store
        self.store_thread = AsyncStore(store)
        """Every call on the store runs on its one thread (chdb's client is sync only)."""
        self.blobs = blobs
        self.producer = producer or Producer(bus, client_id=cfg.worker_id)
        self._own_producer = producer is None
        self.rng = random.Random(seed)
        self.consumer = Consumer(bus, topics=bus.topics.all(), group=cfg.projection.group,
                                 raw_batch_handler=self.project, max_batch=cfg.projection.batch_rows,
                                 linger_s=cfg.projection.linger_ms / 1000,
                                 fetch_max_wait_ms=cfg.projection.fetch_max_wait_ms,
                                 client_id=f"{cfg.worker_id}-projection")
        self.sql: SqlServer | None = None
        self.projected = 0
        self.projected_by_clickhouse = 0
        self._last_projected = time.monotonic()
        self._usage_since = time.monotonic()
        self._stopping = asyncio.Event()
        self._drain: asyncio.Task[None] | None = None
        self._deciding: asyncio.Task[None] | None = None
        self._pending_requests: dict[str, int] = {}
        self._last_plan_at: float | None = None
        """When (monotonic) the scheduler last planned: the time between two plans is its cycle."""
        self._cycles_s: deque[float] = deque(maxlen=CYCLES_KEPT)
        # What earlier passes learned: later passes read only open groups and new outcomes.
        self.horizon = Horizon()
        # The horizon the store kept from an earlier process (None: a new or rebuilt store); saved
        # every HORIZON_SAVE_MS, so the first pass after a restart does not read the whole run.
        self._restored: Horizon | None = None
        # Success rates, success lengths and the experience pool: read again every stats_every_s.
        self.slow = SlowStats(every_ms=int(cfg.scheduler.stats_every_s * 1000))
        self._horizon_saved_ms = 0
        # Batches this process emitted (the log scan at start covers earlier processes).
        self._used: set[str] = set()
        self._last_seq = -1
        self.batches_emitted = 0
        self.last_plan: Plan | None = None
        self.batchable: int | None = None
        """Groups a batch could take, as the last scheduler pass saw them (None: no pass yet)."""
        self.batch_passes_skipped = 0
        self.last_round: RoundPlan | None = None
        self.rounds_started = 0

    # ---------------------------------------------------------------- projection

    async def project(self, records: list[Any]) -> list[tuple[Any, DecodeError]]:
        """Write a fetch's records to the projection; returns those that do not decode (the
        consumer dead-letters them, then commits: only after this returns)."""
        done = await self.store_thread.run(avroload.project_records, self.store, records, projection.write_events,
                                    self.cfg.projection.clickhouse_decode, kind="project")
        self.projected += done.events
        self.projected_by_clickhouse += done.by_sql
        self._last_projected = time.monotonic()
        return done.failed

    async def caught_up(self) -> None:
        """Wait until the consumer joined and the replay of the log went quiet."""
        await self.consumer.started.wait()
        start = time.monotonic()
        # Caught up = every partition read to the high watermark its fetch reported. Waiting for
        # the projection to go quiet instead never ends once many workers heartbeat every second.
        while (time.monotonic() - max(self._last_projected, start) < CATCH_UP_IDLE_S
               and time.monotonic() - start < CATCH_UP_MAX_S
               and not self._stopping.is_set() and not self.consumer.reached_end.is_set()):
            await asyncio.sleep(0.1)

    # ---------------------------------------------------------------- scheduling

    async def schedule_once(self, at_ms: int | None = None) -> Plan:
        at = at_ms if at_ms is not None else now_ms()
        self._forget_stale_pending(at)
        pending = dict(self._pending_requests)
        horizon = self._horizon()
        inputs, known = await self.store_thread.run(
            lambda: schedule_inputs(self.store, self.cfg, now_ms=at, pending_requests=set(pending),
                                    horizon=horizon, slow=self.slow), kind="schedule")
        self._move_horizon(horizon, inputs.open_since_ms, pending)
        await self._save_horizon(at)
        for rid in known:
            self._pending_requests.pop(rid, None)
        plan = plan_requests(inputs.tasks, inputs.load, inputs.retries, scheduler=self.cfg.scheduler,
                             curation=self.cfg.curation, groups_per_batch=self.cfg.batcher.groups_per_batch, rng=self.rng,
                             refill_s=self._refill_s())
        await self._send_requests(plan.requests, at_ms=at, version=inputs.load.current_version)
        if plan.requests or plan.paused != (self.last_plan.paused if self.last_plan else None):
            log.info("scheduled %d rollouts (in flight %d, limit %d, lag %d)%s", len(plan.requests),
                     inputs.load.in_flight, plan.limit, plan.lag, f"; paused: {plan.paused}" if plan.paused else "")
        self.last_plan = plan
        self.batchable = inputs.batchable
        return plan

    def _refill_s(self) -> float:
        """How long the requests of this pass must last (``scheduler.refill_time`` of the times
        between the latest passes' plans). Called once a pass, when it plans."""
        now = time.monotonic()
        if self._last_plan_at is not None:
            self._cycles_s.append(now - self._last_plan_at)
        self._last_plan_at = now
        s = self.cfg.scheduler
        return refill_time(self._cycles_s, interval_s=s.interval_s, refill_cycles=s.refill_cycles)

    def _horizon(self) -> Horizon:
        """The horizon a pass may use: the kept one once the projection holds the whole log up to
        where it stood when the consumer joined. Before that, rows with old time stamps may still
        arrive: a pass reads from the horizon an earlier process saved in the store (valid: it was
        computed from rows the store still holds), on a copy it does not move, or else the whole run."""
        if self.consumer.reached_end.is_set():
            return self.horizon
        return self._restored.copy() if self._restored is not None else Horizon()

    async def _save_horizon(self, at_ms: int) -> None:
        if not self.consumer.reached_end.is_set() or at_ms - self._horizon_saved_ms < HORIZON_SAVE_MS:
            return
        self._horizon_saved_ms = at_ms
        state = self.horizon.copy()
        await self.store_thread.run(lambda: state.save(self.store, now_ms=at_ms))

    async def restore_horizon(self) -> None:
        """Take up the horizon the store kept (run once, after the migrations)."""
        self._restored = await self.store_thread.run(Horizon.load, self.store)
        if self._restored is not None:
            self.horizon = self._restored.copy()
            log.info("curation horizon restored from the store: groups requested since %s, longest "
                     "successes of %d tasks", _clock(self._restored.open_since_ms), len(self._restored.lengths))

    def _move_horizon(self, used: Horizon, open_since_ms: int, pending: dict[str, int]) -> None:
        """Later passes read groups requested since the oldest one still open, or since the
        oldest request sent before this pass (it may not have reached the projection yet)."""
        if used is self.horizon:
            self.horizon.open_since_ms = min([open_since_ms, *pending.values()])

    def _forget_stale_pending(self, at_ms: int) -> None:
        timeout_ms = int(self.cfg.scheduler.request_timeout_s * 1000)
        self._pending_requests = {r: t for r, t in self._pending_requests.items() if at_ms - t < timeout_ms}

    async def _send_requests(self, requests: Sequence[PlannedRequest], *, at_ms: int, version: int) -> None:
        s = self.cfg.scheduler
        events = []
        for r in requests:
            sampling = Sampling(temperature=s.temperature, top_p=s.top_p, max_new_tokens=s.max_new_tokens,
                                seed=r.seed, frequency_penalty=s.frequency_penalty)
            events.append(RolloutRequested.new(
                run_id=self.cfg.run_id, producer=self.cfg.worker_id, request_id=r.request_id, task_id=r.task_id,
                group_id=r.group_id, rollout_index=r.rollout_index, group_size=r.group_size, max_steps=r.max_steps,
                attempt=r.attempt, mode=s.mode, backend=r.backend, sampling=sampling, scheduled_at_version=version))
        # Produced in plan order, acknowledged together: one broker round trip a pass, not one a
        # request (awaited one by one, 128 requests took seconds on a busy machine, and the env
        # slots ran dry before the next pass).
        results = await asyncio.gather(*(self.producer.send(e) for e in events), return_exceptions=True)
        for r, result in zip(requests, results, strict=True):
            if not isinstance(result, BaseException):
                self._pending_requests[r.request_id] = at_ms
        for result in results:
            if isinstance(result, BaseException):
                raise result

    async def coupled_once(self, at_ms: int | None = None) -> RoundPlan:
        """One pass of the coupled baseline (``pipeline: coupled``): request, assemble or wait."""
        at = at_ms if at_ms is not None else now_ms()
        self._forget_stale_pending(at)
        pending = dict(self._pending_requests)
        horizon = self._horizon()
        state, tasks, known, open_since = await self.store_thread.run(
            lambda: round_inputs(self.store, self.cfg, now_ms=at, pending_requests=set(pending),
                                 horizon=horizon, slow=self.slow))
        self._move_horizon(horizon, open_since, pending)
        await self._save_horizon(at)
        for rid in known:
            self._pending_requests.pop(rid, None)
        plan = plan_round(state, tasks, groups_per_batch=self.cfg.batcher.groups_per_batch, curation=self.cfg.curation,
                          rng=self.rng)
        if plan.step == "request":
            version = max(state.current_version, state.published_version or 0)
            await self._send_requests(plan.requests, at_ms=at, version=version)
            self.rounds_started += 1
            log.info("coupled round %d: %d rollouts in %d groups (policy version %d)", self.rounds_started,
                     len(plan.requests), len({r.group_id for r in plan.requests}), version)
        elif plan.step == "assemble" and self.cfg.batcher.enabled:
            await self.batch_once(at, take_all=True)
        if plan.waiting_for and plan.waiting_for != (self.last_round.waiting_for if self.last_round else None):
            before = self.last_round.waiting_for if self.last_round and self.last_round.waiting_for else ""
            changed = plan.waiting_for.split(":")[0] != before.split(":")[0]   # not every count change
            log.log(logging.INFO if changed else logging.DEBUG, "coupled: waiting: %s", plan.waiting_for)
        self.last_round = plan
        return plan

    # ---------------------------------------------------------------- batching

    async def scan_batches(self) -> None:
        """Rollouts in every BatchAssembled on the log, projected or not (run once at start)."""
        async for d in read_topic(self.bus, self.bus.topics.batches, idle_timeout_s=2.0):
            if isinstance(d.event, BatchAssembled):
                self._used.update(d.event.rollout_ids)
                self._last_seq = max(self._last_seq, d.event.seq)

    async def batch_when_ready(self) -> BatchAssembled | None:
        """A batcher pass, unless the last scheduler pass saw too few complete groups for a batch
        (most passes: a batch needs ``groups_per_batch`` groups, and the passes run every second)."""
        if (self.cfg.scheduler.enabled and self.batchable is not None
                and self.batchable < self.cfg.batcher.groups_per_batch):
            self.batch_passes_skipped += 1
            return None
        return await self.batch_once()

    async def batch_once(self, at_ms: int | None = None, *, take_all: bool = False) -> BatchAssembled | None:
        at = at_ms if at_ms is not None else now_ms()
        cfg = self.cfg
        since = self._horizon().open_since_ms
        inputs = await self.store_thread.run(lambda: batch_inputs(self.store, cfg, since_ms=since, now_ms=at,
                                                           slow=self.slow), kind="batch")
        used = inputs.used | self._used
        plan = plan_batch(inputs.groups, used=used, pool=inputs.pool, current_version=inputs.current_version,
                          curation=cfg.curation, batcher=cfg.batcher, max_attempts=cfg.scheduler.max_attempts, now_ms=at,
                          take_all=take_all)
        if plan is None:
            return None
        steps = await self.store_thread.run(projection.steps_of, self.store, plan.rollout_ids)
        late = [o.rollout_id for _, o in plan.outcomes
                if len(steps.get(o.rollout_id, ())) < o.num_steps and at - o.finished_ms < cfg.batcher.steps_grace_s * 1000]
        if late:
            log.debug("batch waits for the steps of %d rollouts to reach the projection", len(late))
            return None
        seq = max(inputs.last_seq, self._last_seq) + 1
        manifest = build_manifest(plan, steps, run_id=cfg.run_id, seq=seq, curation=cfg.curation)
        data = manifest.to_bytes()
        digest = await asyncio.get_running_loop().run_in_executor(None, self.blobs.put, data)  # I/O
        rollout_ids = plan.rollout_ids
        # The log decides what was used: re-check right before emitting (another emission may
        # have been projected since the plan was made). Only the online rollouts: an experience-
        # pool success is replayed into every all-fail group of its task (a task with one oracle
        # solution puts the same one in again), which is not a second use.
        online = [o.rollout_id for v, o in plan.outcomes if o is not v.injected]
        if await self.store_thread.run(projection.batch_exists, self.store, manifest.batch_id, online):
            log.warning("batch %s (or one of its rollouts) is already on the log; not emitting it", manifest.batch_id)
            return None
        # Staleness is the policy's: an experience-pool sample (an oracle's or an earlier run's) has
        # no version of this run's policy (it is stamped 0) and would read as "trained v36 on v0".
        versions = [s.policy_version for s in manifest.samples if s.origin == "online"] or [0]
        event = BatchAssembled.new(
            run_id=cfg.run_id, producer=cfg.worker_id, batch_id=manifest.batch_id, seq=seq, manifest_digest=digest,
            manifest_bytes=len(data), num_samples=len(manifest.samples), num_groups=len(plan.verdicts),
            num_trajectories=len(rollout_ids), rollout_ids=rollout_ids,
            task_ids=sorted({v.task_id for v in plan.verdicts}), min_policy_version=min(versions),
            max_policy_version=max(versions), trainer_version=inputs.current_version,
            injected=sum(v.injected is not None for v in plan.verdicts))
        await self.producer.send(event)
        self._used.update(rollout_ids)
        self._last_seq = seq
        self.batches_emitted += 1
        log.info("batch %s seq %d: %d groups, %d trajectories, %d samples (%d injected)", event.batch_id, seq,
                 event.num_groups, event.num_trajectories, event.num_samples, event.injected)
        return event

    # ---------------------------------------------------------------- loops

    async def _every(self, interval_s: float, step: Callable[[], Awaitable[object]]) -> None:
        while not self._stopping.is_set():
            await step()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), timeout=interval_s)

    async def _serve_sql(self) -> None:
        target = self.store.target
        if not self.cfg.http.enabled or target.kind != "chdb" or target.path is None:
            return
        http = self.cfg.http
        self.sql = SqlServer.from_config(http, target.path, self.store.database)
        port = await self.sql.start()
        marker = http_file(target.path)
        marker.write_text(self.sql.url + "\n")
        if self.cfg.http.port_file:
            Path(self.cfg.http.port_file).write_text(f"{port}\n")
        try:
            await self._stopping.wait()
        finally:
            marker.unlink(missing_ok=True)
            await self.sql.stop()

    async def _decide(self) -> None:
        await self.scan_batches()
        await self.caught_up()
        log.info("projection caught up (%d records); scheduling and batching start", self.projected)
        async with asyncio.TaskGroup() as tg:
            if self.cfg.pipeline == "coupled":
                # One loop decides everything: requesting and batching must never overlap.
                if self.cfg.scheduler.enabled:
                    tg.create_task(self._every(self.cfg.scheduler.interval_s, self.coupled_once))
                return
            if self.cfg.scheduler.enabled:
                tg.create_task(self._every(self.cfg.scheduler.interval_s, self.schedule_once))
            if self.cfg.batcher.enabled:
                tg.create_task(self._every(self.cfg.batcher.interval_s, self.batch_when_ready))
            tg.create_task(self._every(USAGE_LOG_S, self.log_usage))

    async def log_usage(self) -> None:
        """One line per minute: what the store thread did (a slow pass starves the env slots)."""
        usage, since = self.store_thread.take_usage(), self._usage_since
        self._usage_since = time.monotonic()
        if not usage or self._usage_since - since < 1.0:
            return
        parts = [f"{k} {int(n)}x {1000 * run / n:.0f} ms (+{1000 * wait / n:.0f} ms queued)"
                 for k, (n, wait, run) in sorted(usage.items(), key=lambda kv: -kv[1][2])]
        busy, span = sum(run for _, _, run in usage.values()), self._usage_since - since
        log.info("store thread busy %.0f %% of the last %.0f s: %s", 100 * busy / span, span, "; ".join(parts))

    async def run(self) -> None:
        """Until ``stop()``; raises if any part fails (the others are stopped first)."""
        await self.store_thread.run(self.store.migrate)
        await self.restore_horizon()
        try:
            async with asyncio.TaskGroup() as tg:
                tg.create_task(self._serve_sql())
                tg.create_task(self.consumer.run())
                self._deciding = tg.create_task(self._decide())
        finally:
            if self._own_producer:
                await asyncio.get_running_loop().run_in_executor(None, self.producer.close)
            self.store_thread.close()

    def stop(self) -> None:
        """SIGTERM: stop deciding at once, project the tail of the log, then stop consuming.

        The services that produce events are stopped before the data manager (`dart up` does
        so): draining what they wrote leaves the store equal to a replay of the log.
        """
        self._stopping.set()
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            self.consumer.stop()
            return
        if self._drain is None:
            self._drain = loop.create_task(self._drain_then_stop(), name="data-manager-drain")

    async def _drain_then_stop(self) -> None:
        # A batch the batcher is sending as the stop comes is on the log before the drain starts, so
        # the drain projects it; an idle gap was the rule before, and a loaded machine can take
        # longer than any gap to fetch the last record (the store then lacked a batch the log held).
        start = time.monotonic()
        if self._deciding is not None:  # its errors are the task group's to raise
            await asyncio.wait({self._deciding}, timeout=DRAIN_MAX_S)
        left = max(0.0, DRAIN_MAX_S - (time.monotonic() - start))
        at_end = await self.consumer.fetched_to_end(timeout_s=left)
        log.info("stopping after draining the log (%d records projected%s)", self.projected,
                 "" if at_end else f"; not at the log's end after {DRAIN_MAX_S:.0f} s")
        self.consumer.stop()
