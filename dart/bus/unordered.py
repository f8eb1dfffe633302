"""Consuming work that finishes out of order: records handed out one by one, each partition
committed up to its lowest unfinished offset.

:class:`~dart.bus.consumer.Consumer` commits a fetch once its handler returned; a worker whose
records take minutes each and finish in any order (the env worker's trajectories) instead takes
records as it has room (:meth:`UnorderedConsumer.take`), runs them side by side, and marks each
one :meth:`~UnorderedConsumer.done`; the :class:`OffsetWatermark` says how far each partition
may be committed. A rebalance commits what is done in the partitions it takes away, and the
records of those partitions still waiting in the worker become stale
(:meth:`~UnorderedConsumer.current` says so): another member now owns them and redoes them from
the committed offset.

With no group (``group=None``) the same consumer is a plain reader: it reads the partitions it is
:meth:`~UnorderedConsumer.assign`-ed from the offsets given and commits nothing. ``read_topic``
(a topic from its first offset to its end, or on) and the env worker's reply inbox (one
partition, from the inbox's own marker) read this way.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener, TopicPartition
from aiokafka.errors import CommitFailedError, KafkaError

from dart.bus import prom
from dart.bus.config import BusConfig
from dart.bus.producer import Producer
from dart.bus.records import Delivered, at_end, dead_letter, kafka_consumer
from dart.errors import DecodeError

log = logging.getLogger(__name__)


@dataclass
class OffsetWatermark:
    """Per partition, the offset a consumer may commit when records finish out of order.

    Every record handed out is ``track``-ed; ``complete`` marks one done. The commit point of a
    partition is its lowest unfinished offset (or one past the highest tracked when none is
    unfinished): everything below it is done, so a restart from there redoes only unfinished
    work. ``complete`` returns the new commit point when it moved, else None. Pure: no broker.
    """

    _pending: dict[int, set[int]] = field(default_factory=dict)
    _next: dict[int, int] = field(default_factory=dict)
    _committed: dict[int, int] = field(default_factory=dict)

    def track(self, partition: int, offset: int) -> None:
        if offset < self._next.get(partition, 0):
            raise ValueError(f"offset {offset} of partition {partition} tracked out of order "
                             f"(next expected >= {self._next[partition]})")
        self._pending.setdefault(partition, set()).add(offset)
        self._next[partition] = offset + 1
        self._committed.setdefault(partition, offset)  # where this consumer started: nothing to commit yet

    def complete(self, partition: int, offset: int) -> int | None:
        pending = self._pending.get(partition)
        if pending is None or offset not in pending:
            return None  # a partition forgotten in a rebalance, or a duplicate completion
        pending.discard(offset)
        point = self.commit_point(partition)
        if point is not None and point > self._committed.get(partition, -1):
            self._committed[partition] = point
            return point
        return None

    def commit_point(self, partition: int) -> int | None:
        """Offset to commit (the next one to read after a restart); None if nothing tracked."""
        if partition not in self._next:
            return None
        pending = self._pending.get(partition)
        return min(pending) if pending else self._next[partition]

    def forget(self, partitions: Iterable[int]) -> None:
        """Drop partitions this consumer no longer owns (a rebalance took them)."""
        for p in partitions:
            self._pending.pop(p, None)
            self._next.pop(p, None)
            self._committed.pop(p, None)

    def in_flight(self) -> int:
        return sum(len(p) for p in self._pending.values())


@dataclass(frozen=True, slots=True)
class Taken:
    """A record handed out by :meth:`UnorderedConsumer.take`, with the partition's generation
    when it was read (a rebalance that takes the partition away makes it stale)."""

    delivered: Delivered
    generation: int

    @property
    def partition(self) -> int:
        return self.delivered.partition

    @property
    def offset(self) -> int:
        return self.delivered.offset


class _Rebalance(ConsumerRebalanceListener):  # type: ignore[misc]
    def __init__(self, consumer: UnorderedConsumer) -> None:
        self.consumer = consumer

    async def on_partitions_revoked(self, revoked: Any) -> None:
        await self.consumer.let_go({tp.partition for tp in revoked})

    async def on_partitions_assigned(self, assigned: Any) -> None:
        log.info("%s: assigned %s partitions %s", self.consumer.client_id, self.consumer.topic,
                 sorted(tp.partition for tp in assigned))
        self.consumer.assigned.set()


class UnorderedConsumer:
    """A member of consumer group ``group`` on ``topic`` whose records finish in any order, or
    with ``group=None`` a reader of the partitions it is assigned that commits nothing.

    ``start`` joins the group; ``take`` returns the next records (at most ``max_records``, None:
    what is there); ``done`` marks one finished, and :meth:`commits` (run it as a task) commits
    each partition up to its lowest unfinished offset as soon as that moves. ``stop`` leaves the
    group: whatever was not done is redone by another member. A record that does not decode goes
    to the dead-letter topic and is done at once (with no group, to ``on_undecodable``: the
    reader does not own the topic). A record whose headers ``wanted`` refuses is passed over
    undecoded (the reply inbox skips other workers' answers).
    """

    def __init__(self, cfg: BusConfig, *, group: str | None, topic: str | None = None, client_id: str | None = None,
                 producer: Producer | None = None, run_id: str | None = None, max_records: int | None = 1,
                 wanted: Callable[[dict[str, bytes]], bool] | None = None,
                 on_undecodable: Callable[[Any, DecodeError], None] | None = None,
                 fetch_max_wait_ms: int | None = None) -> None:
        if group is not None and (topic is None or producer is None):
            raise ValueError("a group member needs its topic and a producer (for the dead-letter topic)")
        if group is None and topic is not None:
            raise ValueError("a reader with no group reads what it is assigned: give no topic")
        self.cfg = cfg
        self.topic = topic
        self.group = group
        self.client_id = client_id
        self.producer = producer
        self.run_id = run_id or cfg.prefix
        self.max_records = max_records
        self.wanted = wanted
        self.on_undecodable = on_undecodable
        self.fetch_max_wait_ms = fetch_max_wait_ms
        """None: the bus's (short: replies ride on it); a reader in no hurry asks for longer."""
        self.label = group or client_id
        """Metrics label of the records read (none for an anonymous reader)."""
        self.watermark = OffsetWatermark()
        self.assigned = asyncio.Event()
        """Set once the group gave this member partitions."""
        self.fetched = 0
        """Records read, passed over and undecodable ones included."""
        self.passed_over = 0
        """Records ``wanted`` refused."""
        self._generations: dict[int, int] = {}
        self._commit_wanted = asyncio.Event()
        self._consumer: AIOKafkaConsumer | None = None

    async def start(self) -> None:
        self._consumer = kafka_consumer(self.cfg, group=self.group, client_id=self.client_id,
                                        fetch_max_wait_ms=self.fetch_max_wait_ms)
        if self.group is not None:
            self._consumer.subscribe([self.topic], listener=_Rebalance(self))
        await self._consumer.start()

    async def stop(self) -> None:
        if self._consumer is not None:
            # NOTE: aiokafka's stop() raises CancelledError if its own background task has not run
            # once yet (a reader stopped right after it started); let it run first.
            await asyncio.sleep(0)
            await self._consumer.stop()  # leaves the group: the others take over at once
            self._consumer = None

    async def partitions(self, topic: str) -> list[int]:
        """The partitions of ``topic`` (none if it does not exist)."""
        assert self._consumer is not None, "start() first"
        parts = self._consumer.partitions_for_topic(topic)
        if not parts:
            await self._consumer.force_metadata_update()
            parts = self._consumer.partitions_for_topic(topic)
        return sorted(parts or ())

    async def assign(self, start: Mapping[tuple[str, int], int | None]) -> None:
        """With no group: read these ``(topic, partition)``s from these offsets (None: the first)."""
        assert self._consumer is not None and self.group is None, "a reader with no group, started"
        tps = {TopicPartition(t, p): offset for (t, p), offset in start.items()}
        self._consumer.assign(list(tps))
        for tp, offset in tps.items():
            if offset is None:
                await self._consumer.seek_to_beginning(tp)
            else:
                self._consumer.seek(tp, offset)

    async def at_end(self) -> bool:
        """Whether every owned partition was read up to the high watermark its last fetch reported."""
        assert self._consumer is not None
        return await at_end(self._consumer)

    async def take(self) -> list[Taken]:
        """The next records of the owned partitions (waits up to 200 ms for some; may be empty)."""
        assert self._consumer is not None, "start() first"
        fetched = await self._consumer.getmany(timeout_ms=200, max_records=self.max_records)
        if self.label is not None:
            prom.consumed(self.label, fetched)
            await prom.lag(self._consumer, self.label)
        out = []
        for tp, records in fetched.items():
            self.fetched += len(records)
            for rec in records:
                if self.group is not None:
                    self.watermark.track(tp.partition, rec.offset)
                if self.wanted is not None and not self.wanted(dict(rec.headers or ())):
                    self.passed_over += 1
                    self._complete(tp.partition, rec.offset)
                    continue
                try:
                    delivered = Delivered.decoded(rec)
                except DecodeError as exc:
                    await self._undecodable(rec, exc)
                    self._complete(tp.partition, rec.offset)
                    continue
                out.append(Taken(delivered, self._generations.get(tp.partition, 0)))
        return out

    def current(self, taken: Taken) -> bool:
        """Whether ``taken``'s partition is still this member's since it was read."""
        return taken.generation == self._generations.get(taken.partition, 0)

    def done(self, taken: Taken) -> None:
        """``taken`` finished (its effects are durable): it need never be redone."""
        self._complete(taken.partition, taken.offset)

    def _complete(self, partition: int, offset: int) -> None:
        if self.group is not None and self.watermark.complete(partition, offset) is not None:
            self._commit_wanted.set()

    async def commits(self) -> None:
        """Commit whenever a commit point moved; runs until cancelled."""
        while True:
            await self._commit_wanted.wait()
            self._commit_wanted.clear()
            await self.commit()

    async def commit(self, partitions: set[int] | None = None) -> None:
        """Commit the commit point of the owned ``partitions`` (all when None)."""
        assert self._consumer is not None and self.group is not None
        owned = {tp.partition for tp in self._consumer.assignment()}
        offsets = {}
        for p in owned if partitions is None else partitions & owned:
            point = self.watermark.commit_point(p)
            if point is not None:
                offsets[TopicPartition(self.topic, p)] = point
        if not offsets:
            return
        log.debug("%s: commit %s", self.client_id, {tp.partition: o for tp, o in offsets.items()})
        try:
            await self._consumer.commit(offsets)
        except (CommitFailedError, KafkaError) as exc:
            log.warning("%s: commit failed (%s); those records may be redone", self.client_id, exc)

    async def let_go(self, partitions: set[int]) -> None:
        """Commit what is done in ``partitions``, then forget them (a rebalance took them)."""
        await self.commit(partitions)
        self.watermark.forget(partitions)
        for p in partitions:  # records of these partitions still waiting now belong to another member
            self._generations[p] = self._generations.get(p, 0) + 1

    async def _undecodable(self, rec: Any, exc: DecodeError) -> None:
        if self.group is None:
            if self.on_undecodable is not None:
                self.on_undecodable(rec, exc)
            return
        assert self.producer is not None
        prom.dead_lettered(self.group, "decode")
        await self.producer.send(dead_letter(rec, run_id=self.run_id, producer=self.client_id or self.group,
                                             group=self.group, stage="decode", exc=exc,
                                             max_value_bytes=self.cfg.max_message_bytes // 2),
                                 topic=self.cfg.topics.dlq)
