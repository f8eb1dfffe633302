"""Consuming events: an asyncio consumer-group member that commits only after the effect.

Records are handled in partition order. An offset is committed only after the handler for
that record (and every record before it) returned, so a crash replays the tail and an
idempotent handler makes the replay harmless. A record that cannot be decoded, or whose
handler keeps failing, goes to the dead-letter topic with its error, its original bytes and
where it came from; then the consumer carries on. ``stop()`` (wired to SIGTERM by the
services) finishes the record in hand, commits and closes.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import signal
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from typing import Any, TypeVar

from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener, TopicPartition
from aiokafka.errors import CommitFailedError, KafkaError

from dart.bus import prom
from dart.bus.config import BusConfig
from dart.bus.producer import Producer
from dart.bus.records import Delivered, at_end, dead_letter, kafka_consumer
from dart.bus.unordered import UnorderedConsumer
from dart.config import event_log_fields, log_context
from dart.errors import DecodeError

log = logging.getLogger(__name__)
T = TypeVar("T")


Handler = Callable[[Delivered], Awaitable[None]]
BatchHandler = Callable[[list[Delivered]], Awaitable[None]]
RawBatchHandler = Callable[[list[Any]], Awaitable[Sequence[tuple[Any, DecodeError]]]]
"""Takes a fetch's records undecoded (aiokafka ConsumerRecords); returns those that do not
decode, with why (the consumer dead-letters them)."""


class _Assigned(ConsumerRebalanceListener):  # type: ignore[misc]
    def __init__(self, started: asyncio.Event, name: str) -> None:
        self.started = started
        self.name = name

    async def on_partitions_revoked(self, revoked: Any) -> None:
        if revoked:
            log.debug("%s: partitions revoked %s", self.name, sorted((tp.topic, tp.partition) for tp in revoked))

    async def on_partitions_assigned(self, assigned: Any) -> None:
        log.info("%s: assigned %d partitions", self.name, len(assigned))
        self.started.set()


JOIN_WARN_S = 30.0
"""A consumer that has waited this long for its group's partitions says so (and again as often)."""

SLOW_FETCH_WAIT_MS = 500
"""Fetch wait of consumers whose records come every several seconds (batches, weights): the dev
broker holds an empty fetch for the whole wait, so a short one polls it ~50 times a second
(4 idle consumers at 20 ms: ~40 % of a core of the broker; at 500 ms: ~4 %)."""


class Consumer:
    """A member of consumer group ``group`` on ``topics``.

    Give ``handler`` (one record at a time; failures go to the DLQ after ``handler_retries``)
    or ``batch_handler`` (a list per partition fetch, for batched inserts; if it keeps failing
    the consumer raises and nothing of that batch is committed), or ``raw_batch_handler`` (the
    same, but the records undecoded: the handler decodes them itself and returns the ones that do
    not decode, which go to the dead-letter topic like any other).
    """

    def __init__(
        self,
        cfg: BusConfig,
        *,
        topics: Iterable[str],
        group: str,
        handler: Handler | None = None,
        batch_handler: BatchHandler | None = None,
        raw_batch_handler: RawBatchHandler | None = None,
        from_beginning: bool = True,
        max_batch: int = 500,
        handler_retries: int = 2,
        retry_backoff_s: float = 0.2,
        producer: Producer | None = None,
        client_id: str | None = None,
        concurrent_partitions: bool = False,
        linger_s: float = 0.0,
        pipeline_records: int = 0,
        fetch_max_wait_ms: int | None = None,
        commit_when: Callable[[], bool] | None = None,
    ) -> None:
        if sum(h is not None for h in (handler, batch_handler, raw_batch_handler)) != 1:
            raise ValueError("give exactly one of handler, batch_handler or raw_batch_handler")
        if pipeline_records and batch_handler is None:
            raise ValueError("pipeline_records needs a batch_handler")
        if commit_when is not None and (pipeline_records or raw_batch_handler is not None):
            raise ValueError("commit_when works with a handler or a batch_handler, unpipelined")
        self.cfg = cfg
        self.topics = list(topics)
        self.group = group
        self.handler = handler
        self.batch_handler = batch_handler
        self.raw_batch_handler = raw_batch_handler
        self.from_beginning = from_beginning
        self.max_batch = max_batch
        self.handler_retries = handler_retries
        self.retry_backoff_s = retry_backoff_s
        self._producer = producer
        self._own_producer = producer is None
        self.client_id = client_id or group
        # Partitions are independent logs: handling their fetches at once keeps order within
        # each one and lets a slow batch on one partition not hold back the others.
        self.concurrent_partitions = concurrent_partitions
        # raw_batch_handler only: gather fetches for up to this long (or max_batch records) into
        # one call, for handlers with a fixed cost per call (a ClickHouse insert).
        self.linger_s = linger_s
        # batch_handler only: keep fetching while earlier fetches are still being handled, up to
        # this many records in hand (0: fetch, handle, commit, fetch: one fetch at a time). For
        # handlers that wait on a shared resource, such as the rollout worker's engine, which
        # batches whatever is queued when it is free: records that arrive while it works join
        # its next batch instead of waiting for the whole fetch before them to be answered.
        # Offsets are still committed in log order, once every earlier fetch is done.
        self.pipeline_records = pipeline_records
        # How long the broker may hold a fetch that has nothing to return (None: the bus's
        # ``fetch_max_wait_ms``, short for the env <-> rollout hot path). A consumer that does not
        # need its records within tens of ms asks for longer: every idle fetch is a broker request.
        self.fetch_max_wait_ms = cfg.fetch_max_wait_ms if fetch_max_wait_ms is None else fetch_max_wait_ms
        # handler / batch_handler: asked after the records of a fetch were handled; False holds
        # their commit back, for a handler whose effect becomes durable only now and then (the
        # trainer's full checkpoints). The next True commits every record handled up to then; a
        # restart before it gets the held-back records delivered again.
        self.commit_when = commit_when
        self._flight: collections.deque[tuple[asyncio.Task[None], dict[Any, int], int]] = collections.deque()
        self._flight_records = 0
        self.started = asyncio.Event()
        self.reached_end = asyncio.Event()
        """Set once every assigned partition was read up to the high watermark its fetch reported
        (the log as it was is replayed), however busy the topics keep being."""
        self._stopping = asyncio.Event()
        self._end_fetch_started = float("-inf")
        """When (monotonic) the newest fetch that left every assigned partition at its high
        watermark was started: every record acknowledged before then has been taken in hand."""
        self._watch_end = False
        self.handled = 0
        self.dead_lettered = 0

    def stop(self) -> None:
        """Finish the record in hand, commit, close. Safe to call from a signal handler."""
        self._stopping.set()

    async def fetched_to_end(self, *, timeout_s: float, poll_s: float = 0.05) -> bool:
        """Wait until a fetch started after this call has left every assigned partition at its
        high watermark: then every record acknowledged before the call is in hand (and
        ``stop()`` finishes it). False when ``timeout_s`` passed first or nothing is assigned."""
        # getmany() hands out what the background fetcher already holds, and the high watermarks of
        # its last responses: only a fetch started two broker waits later is sure to reflect a
        # response asked for after this call.
        asked = time.monotonic()
        since = asked + 2 * self.fetch_max_wait_ms / 1000 + 0.1
        self._watch_end = True
        try:
            while self._end_fetch_started < since:
                if time.monotonic() - asked > timeout_s or not self.started.is_set():
                    return False
                await asyncio.sleep(poll_s)
            return True
        finally:
            self._watch_end = False

    @property
    def producer(self) -> Producer:
        if self._producer is None:
            self._producer = Producer(self.cfg, client_id=f"{self.client_id}-dlq")
        return self._producer

    async def run(self) -> None:
        consumer = kafka_consumer(self.cfg, group=self.group, client_id=self.client_id,
                                  from_beginning=self.from_beginning, fetch_max_wait_ms=self.fetch_max_wait_ms)
        consumer.subscribe(self.topics, listener=_Assigned(self.started, self.group))
        await consumer.start()
        watchdog = asyncio.create_task(self._join_watch(), name=f"{self.group}-join-watch")
        try:
            while not self._stopping.is_set():
                fetch_started = time.monotonic()
                fetch = asyncio.ensure_future(consumer.getmany(timeout_ms=200, max_records=self.max_batch))
                stop = asyncio.ensure_future(self._stopping.wait())
                await asyncio.wait({fetch, stop}, return_when=asyncio.FIRST_COMPLETED)
                stop.cancel()
                if not fetch.done():
                    fetch.cancel()
                    break
                batches = fetch.result()
                prom.consumed(self.group, batches)
                await prom.lag(consumer, self.group)
                if self.pipeline_records:
                    await self._pipeline(consumer, batches)
                    batches = {}
                if self.raw_batch_handler is not None and batches and self.linger_s > 0:
                    batches = await self._linger(consumer, batches)
                if self.raw_batch_handler is not None and batches:
                    await self._consume_raw(consumer, batches)
                    batches = {}
                if self.concurrent_partitions and len(batches) > 1:
                    await asyncio.gather(*(self._consume(consumer, tp, recs) for tp, recs in batches.items()))
                    batches = {}
                for tp, records in batches.items():
                    if self._stopping.is_set():
                        break
                    await self._consume(consumer, tp, records)
                if (not self.reached_end.is_set() or self._watch_end) and await at_end(consumer):
                    self.reached_end.set()
                    self._end_fetch_started = fetch_started
        finally:
            watchdog.cancel()
            await self._drain(consumer, abort=sys.exc_info()[0] is not None)
            await consumer.stop()
            if self._own_producer and self._producer is not None:
                await asyncio.get_running_loop().run_in_executor(None, self._producer.close)
            log.info("%s: stopped after %d records (%d dead-lettered)", self.group, self.handled,
                     self.dead_lettered)

    async def _join_watch(self, every_s: float = JOIN_WARN_S) -> None:
        """One warning line every ``every_s`` while the group has given this member no partition:
        a join waits until every member the broker knows rejoins or its session times out."""
        t0 = time.monotonic()
        while not self.started.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.started.wait(), every_s)
            if not self.started.is_set():
                log.warning("%s: no partitions after %.0f s: the group %s is still rebalancing (a member "
                            "that does not rejoin holds it up to its session timeout)", self.group,
                            time.monotonic() - t0, self.cfg.group_id(self.group))

    async def _pipeline(self, consumer: AIOKafkaConsumer, batches: dict[Any, list[Any]]) -> None:
        """Start handling a fetch (all its partitions at once) and return while it runs, unless
        ``pipeline_records`` records are in hand: then wait for the oldest fetch first."""
        if batches:
            n = sum(len(r) for r in batches.values())
            task = asyncio.create_task(self._handle_fetch(batches), name=f"{self.group}-fetch")
            self._flight.append((task, {tp: recs[-1].offset + 1 for tp, recs in batches.items()}, n))
            self._flight_records += n
        await self._commit_done(consumer)
        while self._flight and self._flight_records >= self.pipeline_records:
            await asyncio.wait({self._flight[0][0]})
            await self._commit_done(consumer)

    async def _handle_fetch(self, batches: dict[Any, list[Any]]) -> None:
        async def partition(records: list[Any]) -> None:
            good = [d for rec in records if (d := await self._decode(rec)) is not None]
            if good:
                assert self.batch_handler is not None
                await self._retrying(self.batch_handler, good)

        await asyncio.gather(*(partition(recs) for recs in batches.values()))

    async def _commit_done(self, consumer: AIOKafkaConsumer) -> None:
        """Commit the fetches handled so far that no unfinished fetch precedes (log order); a
        handler that kept failing is raised here, with nothing from its fetch on committed."""
        offsets: dict[Any, int] = {}
        while self._flight and self._flight[0][0].done():
            task, done, n = self._flight.popleft()
            self._flight_records -= n
            task.result()
            offsets.update(done)
            self.handled += n
        if not offsets:
            return
        try:
            await consumer.commit(offsets)
        except (CommitFailedError, KafkaError) as exc:
            log.warning("%s: commit of %d partitions failed (%s); the records will be redelivered",
                        self.group, len(offsets), exc)

    async def _drain(self, consumer: AIOKafkaConsumer, *, abort: bool) -> None:
        """On the way out: let the fetches in hand finish and commit them; when leaving on an
        error or a cancellation (``abort``), or if one fails, cancel the rest uncommitted (they
        are redelivered)."""
        if not self._flight:
            return
        try:
            if not abort:
                await asyncio.wait({t for t, _, _ in self._flight})
                await self._commit_done(consumer)
        finally:
            for task, _, _ in self._flight:
                task.cancel()
            await asyncio.gather(*(t for t, _, _ in self._flight), return_exceptions=True)
            self._flight.clear()
            self._flight_records = 0

    async def _linger(self, consumer: AIOKafkaConsumer, batches: dict[Any, list[Any]]) -> dict[Any, list[Any]]:
        """More fetches onto ``batches`` until ``linger_s`` passed since the first or ``max_batch``
        records are in hand (order within each partition kept: one consumer, fetches in turn)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.linger_s
        held = sum(len(r) for r in batches.values())
        while held < self.max_batch and not self._stopping.is_set() and (left := deadline - loop.time()) > 0:
            more = await consumer.getmany(timeout_ms=max(1, int(left * 1000)), max_records=self.max_batch - held)
            for tp, records in more.items():
                batches.setdefault(tp, []).extend(records)
                held += len(records)
        return batches

    async def _consume(self, consumer: AIOKafkaConsumer, tp: TopicPartition, records: list[Any]) -> None:
        if self.batch_handler is not None:
            good = [d for rec in records if (d := await self._decode(rec)) is not None]
            if good:
                await self._retrying(self.batch_handler, good)
            last = records[-1]
        else:
            assert self.handler is not None
            last = None
            for rec in records:
                d = await self._decode(rec)
                if d is not None:
                    try:
                        await self._retrying(self.handler, d)
                    except Exception as exc:
                        await self._dead_letter(rec, "handle", exc)
                last = rec
                # SIGTERM: finish the record in hand, commit it, leave the rest for the next owner.
                if self._stopping.is_set():
                    break
        assert last is not None
        self.handled += records.index(last) + 1
        if self.commit_when is not None and not self.commit_when():
            return
        # Commit only after every record up to here had its effect (or went to the DLQ):
        # a crash before this line replays them, and handlers are idempotent on event_id.
        try:
            await consumer.commit({tp: last.offset + 1})
        except (CommitFailedError, KafkaError) as exc:
            log.warning("%s: commit of %s[%d]@%d failed (%s); the records will be redelivered",
                        self.group, tp.topic, tp.partition, last.offset + 1, exc)

    async def _consume_raw(self, consumer: AIOKafkaConsumer, batches: dict[TopicPartition, list[Any]]) -> None:
        # One call for the whole fetch, every partition: the handler writes one insert per event
        # type, not one per partition (each insert has a fixed cost that small ones pay per record).
        records = [rec for recs in batches.values() for rec in recs]
        for rec, exc in await self._retrying(self.raw_batch_handler, records):
            await self._dead_letter(rec, "decode", exc)
        self.handled += len(records)
        # Commit only after every record of the fetch had its effect (or went to the DLQ).
        try:
            await consumer.commit({tp: recs[-1].offset + 1 for tp, recs in batches.items()})
        except (CommitFailedError, KafkaError) as exc:
            log.warning("%s: commit of %d partitions failed (%s); the records will be redelivered",
                        self.group, len(batches), exc)

    async def _decode(self, rec: Any) -> Delivered | None:
        try:
            return Delivered.decoded(rec)
        except DecodeError as exc:
            await self._dead_letter(rec, "decode", exc)
            return None

    async def _retrying(self, fn: Callable[[Any], Awaitable[T]], arg: Any) -> T:
        for attempt in range(self.handler_retries + 1):
            try:
                fields = event_log_fields(arg.event) if isinstance(arg, Delivered) else {}
                with prom.handling(self.group), log_context(**fields):  # JSON log lines name the record's ids
                    return await fn(arg)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if attempt == self.handler_retries:
                    raise
                log.warning("%s: handler failed (%s: %s), retry %d/%d", self.group, type(exc).__name__, exc,
                            attempt + 1, self.handler_retries)
                await asyncio.sleep(self.retry_backoff_s * 2**attempt)
        raise AssertionError("unreachable")

    async def _dead_letter(self, rec: Any, stage: str, exc: BaseException) -> None:
        self.dead_lettered += 1
        prom.dead_lettered(self.group, stage)
        log.error("%s: %s failed for %s[%d]@%d: %s: %s -> dead-letter topic", self.group, stage, rec.topic,
                  rec.partition, rec.offset, type(exc).__name__, exc)
        letter = dead_letter(rec, run_id=self.cfg.prefix, producer=self.client_id, group=self.group, stage=stage,
                             exc=exc, max_value_bytes=self.cfg.max_message_bytes // 2)
        await self.producer.send(letter, topic=self.cfg.topics.dlq)


async def read_topic(
    cfg: BusConfig,
    topic: str | Sequence[str],
    *,
    max_records: int | None = None,
    idle_timeout_s: float = 2.0,
    follow: bool | Callable[[], bool] = False,
    end_timeout_s: float | None = None,
    on_error: Callable[[Any, DecodeError], None] | None = None,
    after_fetch: Callable[[], None] | None = None,
    fetch_max_wait_ms: int | None = None,
) -> AsyncIterator[Delivered]:
    """Yield the Delivered events of every partition of ``topic`` (a name, or several) from the
    first offset, without a consumer group (nothing is committed): until the end of the log, or
    ``max_records``, or ``idle_timeout_s`` without a record. ``follow``: read on past the end while
    it is true (a function is asked after each fetch: the metrics sink follows until it is told to
    stop), then on to the end, for at most ``end_timeout_s``. Records that do not decode go to
    ``on_error`` (the consumers that own the topic dead-letter them); ``after_fetch`` is called
    after each fetch, records or none (a reader that flushes on time, not only on records).
    ``fetch_max_wait_ms``: as :class:`Consumer`'s."""
    following = follow if callable(follow) else lambda: follow
    topics = [topic] if isinstance(topic, str) else list(topic)
    reader = UnorderedConsumer(cfg, group=None, max_records=1000, on_undecodable=on_error,
                                fetch_max_wait_ms=fetch_max_wait_ms)
    await reader.start()
    try:
        start = {(t, p): None for t in topics for p in await reader.partitions(t)}
        if not start:
            while following():  # nothing to read yet; a follower waits to be told to stop
                await asyncio.sleep(0.2)
            return
        await reader.assign(start)
        loop = asyncio.get_running_loop()
        seen = 0
        idle_since = loop.time()
        ending_since: float | None = None
        while True:
            before = reader.fetched
            for taken in await reader.take():
                yield taken.delivered
                seen += 1
                if max_records is not None and seen >= max_records:
                    return
            now = loop.time()
            if after_fetch is not None:
                after_fetch()
            fetched = reader.fetched > before
            if fetched:
                idle_since = now
            if following():
                continue
            ending_since = now if ending_since is None else ending_since
            if end_timeout_s is not None and now - ending_since > end_timeout_s:
                return
            if (not fetched and await reader.at_end()) or now - idle_since > idle_timeout_s:
                return
    finally:
        await reader.stop()


def stop_on_signals(*stoppables: Any) -> None:
    """Call ``.stop()`` on each object when the process gets SIGTERM or SIGINT."""
    loop = asyncio.get_running_loop()

    def stop_all() -> None:
        log.info("signal received: stopping")
        for s in stoppables:
            s.stop()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop_all)
