"""Request-reply over the log: a rollout worker answers the exact env worker that asked.

An env worker owns an inbox: one partition of the actions topic, read from the point the
inbox opened. Replies go to that partition with a ``dart-reply-to`` header, so they are both
the answer and part of the durable action log. Requests are matched to replies by the
request's ``event_id`` (``in_reply_to`` of the answer).

Which partition: the one the worker is assigned (``partition=``, the env worker's
``reply_partition``), or else a hash of its worker id. Kafka cannot filter on the broker, so
workers that share a partition each read and skip the others' replies: with W hashed workers
on P partitions every worker reads about W / P records per reply of its own (25x for 100
workers on 4 partitions), and the whole fleet reads W / P times the reply traffic. With a
partition per worker (``bus.partitions["rollout.actions"]`` >= workers, worker i on partition
i) each reads only its own: ``read_amplification`` stays 1 whatever the number of workers.

The inbox reads with an :class:`~dart.bus.unordered.UnorderedConsumer` of no group: one assigned
partition, nothing committed (a restarted worker asks again; old answers are nobody's).

NOTE: the start offset is the offset of a marker record the inbox produces itself (a
``WorkerHeartbeat``), because Tansu's ListOffsets("latest") is wrong; the delivery report's
offset is exact on every broker.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
import zlib
from collections import deque
from typing import Any

from dart.bus.config import BusConfig
from dart.bus.producer import REPLY_TO_HEADER, Producer
from dart.bus.topics import Topics
from dart.bus.unordered import UnorderedConsumer
from dart.errors import ConfigError, DecodeError
from dart.events import Event, ReplyRoute, WorkerHeartbeat

log = logging.getLogger(__name__)


def reply_partition(worker_id: str, partitions: int) -> int:
    return zlib.crc32(worker_id.encode()) % partitions


class ReplyInbox:
    """Where one env worker receives answers to its observations."""

    def __init__(self, cfg: BusConfig, worker_id: str, *, producer: Producer | None = None,
                 topic: str | None = None, partition: int | None = None) -> None:
        self.cfg = cfg
        self.worker_id = worker_id
        self.topic = topic or cfg.topics.actions
        self.partition = partition
        """The assigned reply partition; None hashes the worker id (and may share a partition)."""
        self._producer = producer
        self._own_producer = producer is None
        self._waiting: dict[str, asyncio.Future[Event]] = {}
        self._early: dict[str, Event] = {}
        me = worker_id.encode()
        self._reader = UnorderedConsumer(cfg, group=None, client_id=f"{worker_id}-inbox", max_records=None,
                                         wanted=lambda headers: headers.get(REPLY_TO_HEADER) == me,
                                         on_undecodable=self._undecodable)
        self._task: asyncio.Task[None] | None = None
        self._route: ReplyRoute | None = None
        self._uncorrelated = 0
        self.waits_s: deque[float] = deque(maxlen=100_000)
        """Seconds from ``expect()`` (just before the request is produced) to the answer's
        delivery, for the latest answers: bus overhead plus the policy's own time."""
        self._asked: dict[str, float] = {}

    @property
    def read(self) -> int:
        """Every record read from the reply partition."""
        return self._reader.fetched

    @property
    def ignored(self) -> int:
        """Records read that were not a reply to this worker (another worker's, or markers)."""
        return self._reader.passed_over + self._uncorrelated

    @property
    def read_amplification(self) -> float:
        """Records read per reply of this worker's (1.0 = it reads nothing meant for others)."""
        mine = self.read - self.ignored
        return self.read / mine if mine > 0 else 1.0

    @property
    def route(self) -> ReplyRoute:
        if self._route is None:
            raise RuntimeError("ReplyInbox.start() has not run")
        return self._route

    async def start(self) -> None:
        await self._reader.start()
        parts = await self._reader.partitions(self.topic)
        partition = self.partition if self.partition is not None else reply_partition(self.worker_id, len(parts) or 1)
        if not 0 <= partition < len(parts):
            await self._reader.stop()
            if not parts:
                raise RuntimeError(f"reply topic {self.topic} does not exist (run `dart topics ensure`)")
            raise ConfigError(f"{self.worker_id}: reply partition {partition} but {self.topic} has {len(parts)} "
                              f"partitions; raise bus.partitions['rollout.actions'] to at least the number of "
                              f"env workers (an existing topic keeps its partitions: recreate it)")
        if self._producer is None:
            self._producer = Producer(self.cfg, client_id=f"{self.worker_id}-inbox")
        marker = WorkerHeartbeat.new(
            run_id=self.cfg.prefix, producer=self.worker_id, worker_id=self.worker_id, role="env",
            state="starting", host=socket.gethostname(), pid=os.getpid(), slots=0, slots_busy=0,
            busy_s=0.0, idle_s=0.0, uptime_s=0.0, info={"reply_topic": self.topic, "reply_partition": str(partition)},
        )
        meta = await self._producer.send(marker, topic=self.topic, partition=partition,
                                         key=Topics.key_of(marker))
        await self._reader.assign({(self.topic, partition): meta.offset + 1})
        self._route = ReplyRoute(topic=self.topic, partition=partition, worker_id=self.worker_id)
        self._task = asyncio.create_task(self._read(), name=f"inbox-{self.worker_id}")
        log.info("%s: reply inbox on %s[%d] from offset %d", self.worker_id, self.topic, partition, meta.offset + 1)

    async def _read(self) -> None:
        while True:
            for taken in await self._reader.take():
                self._deliver(taken.delivered.event)

    def _undecodable(self, rec: Any, exc: DecodeError) -> None:
        log.error("%s: undecodable reply at %d: %s", self.worker_id, rec.offset, exc)

    def _deliver(self, event: Event) -> None:
        corr = getattr(event, "in_reply_to", None)
        if corr is None:
            self._uncorrelated += 1
            return
        asked = self._asked.pop(corr, None)
        if asked is not None:
            self.waits_s.append(time.perf_counter() - asked)
        fut = self._waiting.pop(corr, None)
        if fut is None:
            # A reply to a request nobody waits for any more (timed out): drop it, but keep a
            # short memory in case expect() is called right after the answer arrived.
            self._early[corr] = event
            if len(self._early) > 1000:
                self._early.pop(next(iter(self._early)))
        elif not fut.done():
            fut.set_result(event)

    def expect(self, correlation_id: str) -> asyncio.Future[Event]:
        """Register interest in the answer to ``correlation_id``; call before sending the request."""
        fut: asyncio.Future[Event] = asyncio.get_running_loop().create_future()
        if correlation_id in self._early:
            fut.set_result(self._early.pop(correlation_id))
        else:
            self._waiting[correlation_id] = fut
            self._asked[correlation_id] = time.perf_counter()
        return fut

    async def wait(self, correlation_id: str, timeout_s: float) -> Event:
        """The answer to ``correlation_id``; raises TimeoutError after ``timeout_s``."""
        fut = self._waiting.get(correlation_id) or self.expect(correlation_id)
        try:
            return await asyncio.wait_for(fut, timeout_s)
        finally:
            self._waiting.pop(correlation_id, None)
            self._asked.pop(correlation_id, None)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        await self._reader.stop()
        if self._own_producer and self._producer is not None:
            await asyncio.get_running_loop().run_in_executor(None, self._producer.close)

    async def __aenter__(self) -> ReplyInbox:
        await self.start()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()
