"""Producing events: confluent-kafka, idempotent, acks=all.

``send`` resolves once the broker has acknowledged the record (it is durable); ``send_nowait``
buffers, and ``flush`` returns only when every buffered record is acknowledged, raising if
any failed. A background thread serves delivery callbacks so asyncio code never blocks on
the client.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from dataclasses import dataclass
from typing import Any

# librdkafka here, aiokafka in the two consumers: why, with the measured figures, at the import
# in dart/bus/records.py.
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka import Producer as _KafkaProducer

from dart.bus import prom
from dart.bus.config import BusConfig
from dart.errors import BusError
from dart.events import Event, ReplyRoute, encode

log = logging.getLogger(__name__)

REPLY_TO_HEADER = "dart-reply-to"
TYPE_HEADER = "dart-type"


@dataclass(frozen=True, slots=True)
class RecordMeta:
    topic: str
    partition: int
    offset: int


class Producer:
    """One producer per process is enough; it is thread- and task-safe."""

    def __init__(self, cfg: BusConfig, *, client_id: str = "dart", linger_ms: int = 2) -> None:
        self.cfg = cfg
        self._p = _KafkaProducer(
            cfg.librdkafka(**{
                "client.id": client_id,
                "enable.idempotence": True,
                "acks": "all",
                "linger.ms": linger_ms,
                "message.max.bytes": cfg.max_message_bytes,
                "delivery.timeout.ms": 30000,
                # librdkafka's own log lines go through logging, not straight to stderr.
                "logger": logging.getLogger("dart.bus.rdkafka"),
                "log.connection.close": False,
            })
        )
        self._failures: list[str] = []
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._poller = threading.Thread(target=self._poll_loop, name="dart-producer-poll", daemon=True)
        self._poller.start()

    def _poll_loop(self) -> None:
        while not self._closed.is_set():
            self._p.poll(0.05)

    # ------------------------------------------------------------------ produce

    def _produce(self, value: bytes, topic: str, key: bytes | None, partition: int | None,
                 headers: dict[str, bytes] | None, on_delivery: Any) -> None:
        size = len(value) + len(key or b"")
        if size > self.cfg.max_message_bytes:
            # Refused here, with the topic and the fix, rather than as a librdkafka error code later.
            raise BusError(f"record of {size} bytes for {topic} is over bus.max_message_bytes "
                           f"({self.cfg.max_message_bytes}); events stay small: put large payloads in the blob "
                           "store and send the digest")
        kwargs: dict[str, Any] = {"value": value, "key": key, "on_delivery": on_delivery}
        if partition is not None:
            kwargs["partition"] = partition
        if headers:
            kwargs["headers"] = list(headers.items())
        while True:
            try:
                self._p.produce(topic, **kwargs)
                prom.produced(topic)
                return
            except BufferError:
                # Local queue full: let the poller drain deliveries, then try again.
                self._p.poll(0.05)
            except KafkaException as exc:
                raise BusError(f"cannot produce to {topic}: {exc}") from exc

    def _route(self, event: Event, topic: str | None, key: bytes | None) -> tuple[str, bytes | None]:
        prom.event_produced(event)  # every event sent passes here: the timings it carries
        topics = self.cfg.topics
        return (topic or topics.for_event(type(event)), key if key is not None else topics.key_of(event))

    async def send(self, event: Event, *, topic: str | None = None, key: bytes | None = None,
                   partition: int | None = None, headers: dict[str, bytes] | None = None) -> RecordMeta:
        """Produce one event and wait for the broker's acknowledgement."""
        return await self.send_raw(encode(event), *self._route(event, topic, key), partition=partition,
                                   headers=headers)

    async def send_raw(self, value: bytes, topic: str, key: bytes | None = None, *, partition: int | None = None,
                       headers: dict[str, bytes] | None = None) -> RecordMeta:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[RecordMeta] = loop.create_future()

        def done(err: KafkaError | None, msg: Any) -> None:
            if err is not None:
                result: Any = BusError(f"delivery to {topic} failed: {err}")
            else:
                result = RecordMeta(msg.topic(), msg.partition(), msg.offset())
            loop.call_soon_threadsafe(_settle, fut, result)

        self._produce(value, topic, key, partition, headers, done)
        return await fut

    def send_nowait(self, event: Event, *, topic: str | None = None, key: bytes | None = None,
                    partition: int | None = None, headers: dict[str, bytes] | None = None) -> None:
        """Buffer one event; ``flush`` reports whether it (and every other) was acknowledged."""
        self.send_raw_nowait(encode(event), *self._route(event, topic, key), partition=partition, headers=headers)

    def send_raw_nowait(self, value: bytes, topic: str, key: bytes | None = None, *,
                        partition: int | None = None, headers: dict[str, bytes] | None = None) -> None:
        self._produce(value, topic, key, partition, headers, self._record_failure)

    def _record_failure(self, err: KafkaError | None, msg: Any) -> None:
        if err is not None:
            with self._lock:
                self._failures.append(f"{msg.topic()}: {err}")

    def flush(self, timeout_s: float = 30.0) -> None:
        """Block until every buffered record is acknowledged; raise BusError otherwise."""
        remaining = self._p.flush(timeout_s)
        with self._lock:
            failures, self._failures = self._failures, []
        if remaining:
            raise BusError(f"{remaining} records not acknowledged within {timeout_s} s (is the broker up?)")
        if failures:
            raise BusError(f"{len(failures)} records failed: {failures[0]}")

    async def aflush(self, timeout_s: float = 30.0) -> None:
        await asyncio.get_running_loop().run_in_executor(None, self.flush, timeout_s)

    async def reply(self, route: ReplyRoute, event: Event) -> RecordMeta:
        """Answer the env worker that asked: its reply partition, tagged with its id."""
        return await self.send(event, topic=route.topic, partition=route.partition,
                               headers={REPLY_TO_HEADER: route.worker_id.encode()})

    def close(self, timeout_s: float = 10.0) -> None:
        """Flush (BusError when a record is not acknowledged within ``timeout_s``), then release
        the client. What is still unacknowledged then is dropped (flush has already reported it),
        so no librdkafka thread is left retrying a broker that has gone. Closing twice does nothing."""
        if self._closed.is_set():
            return
        try:
            self.flush(timeout_s)
        finally:
            self._closed.set()
            self._poller.join(timeout=1.0)
            self._p.purge()
            self._p.flush(0)  # serve the purged records' delivery reports
            self._p.close()

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _settle(fut: asyncio.Future[Any], result: Any) -> None:
    if fut.done():
        return
    if isinstance(result, BaseException):
        fut.set_exception(result)
    else:
        fut.set_result(result)
