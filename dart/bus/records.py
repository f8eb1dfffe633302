"""What the two consumers share: the Kafka consumer client they read with, a record as delivered,
its dead letter, and whether a read has reached the end of the log.

:class:`~dart.bus.consumer.Consumer` (records handled in partition order, committed after the
effect) and :class:`~dart.bus.unordered.UnorderedConsumer` (records handed out, finished in any
order; with no group, the reader of ``read_topic`` and the reply inbox) are the only classes that
hold a consumer client (``tests/test_layout.py`` keeps it so), and they get it here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# Two Kafka client libraries, measured (benchmarks/kafka_clients.py; figures in benchmarks/README.md):
# the producer stays on confluent-kafka (librdkafka), which produced 2.4-2.8x the events/s of
# aiokafka's producer, and aiokafka's idempotent producer does not even start on the dev broker;
# the consumers are on aiokafka, where neither library consumed or answered a reply faster (the
# medians swap places between runs; the round trip is within a few per cent). So one library
# means these two classes moving to librdkafka, at no measured cost: the open step. They are on
# aiokafka today because their rebalance listeners await the commit of what is done before a
# partition is let go, and their end-of-log and lag checks read its cached high watermarks.
from aiokafka import AIOKafkaConsumer

from dart.bus.config import BusConfig
from dart.events import DeadLetter, Event, decode


@dataclass(frozen=True, slots=True)
class Delivered:
    """An event with where it came from."""

    event: Event
    topic: str
    partition: int
    offset: int
    key: bytes | None
    headers: dict[str, bytes] = field(default_factory=dict)
    timestamp_ms: int = 0

    @classmethod
    def decoded(cls, rec: Any) -> Delivered:
        """The event of a consumed record and where it came from; DecodeError if it does not decode."""
        return cls(decode(rec.value), rec.topic, rec.partition, rec.offset, rec.key, dict(rec.headers or ()),
                   rec.timestamp)


def kafka_consumer(cfg: BusConfig, *, group: str | None, client_id: str | None = None, from_beginning: bool = True,
                   fetch_max_wait_ms: int | None = None) -> AIOKafkaConsumer:
    """A consumer client that commits only when told to: a member of the run's group ``group``
    (``BusConfig.group_id``), or with no group one that reads the partitions it is assigned.
    ``fetch_max_wait_ms`` None: the bus's (short, for the env <-> rollout hot path)."""
    extra: dict[str, Any] = {
        "enable_auto_commit": False,
        "fetch_max_wait_ms": cfg.fetch_max_wait_ms if fetch_max_wait_ms is None else fetch_max_wait_ms,
        "max_partition_fetch_bytes": cfg.max_message_bytes,
        "fetch_max_bytes": cfg.max_message_bytes * 4,
    }
    if client_id is not None:
        extra["client_id"] = client_id
    if group is not None:
        # NOTE: Tansu answers "latest" with a wrong offset; new groups start from the earliest
        # record unless told otherwise, and resume from their committed offsets after that.
        extra.update(group_id=cfg.group_id(group), auto_offset_reset="earliest" if from_beginning else "latest",
                     session_timeout_ms=cfg.session_timeout_ms, heartbeat_interval_ms=cfg.heartbeat_interval_ms)
    return AIOKafkaConsumer(**cfg.aiokafka(**extra))


async def at_end(consumer: AIOKafkaConsumer) -> bool:
    """Whether every assigned partition's position has reached its last reported high watermark
    (the fetch response's high watermark is right on Tansu; its ListOffsets "latest" is not)."""
    tps = consumer.assignment()
    if not tps:
        return False
    for tp in tps:
        hw = consumer.highwater(tp)
        if hw is None or await consumer.position(tp) < hw:
            return False
    return True


def dead_letter(rec: Any, *, run_id: str, producer: str, group: str, stage: str, exc: BaseException,
                max_value_bytes: int) -> DeadLetter:
    """The DLQ record for a consumed record ``rec`` that failed at ``stage``.

    The original bytes go along, cut to ``max_value_bytes``: a poison record as large as the
    broker allows would otherwise make its own dead letter too large to produce, and the
    consumer would stop on the record it was meant to route around.
    """
    value = rec.value or b""
    error = f"{exc}"[:4000]
    if len(value) > max_value_bytes:
        error = f"{error} [value cut from {len(value)} to {max_value_bytes} bytes]"
        value = value[:max_value_bytes]
    return DeadLetter.new(run_id=run_id, producer=producer, source_topic=rec.topic, partition=rec.partition,
                          offset=rec.offset, key=rec.key, value=value, stage=stage, error_type=type(exc).__name__,
                          error=error, consumer_group=group)
