"""Read topics from their first offsets without a consumer group, until told to stop and at the end.

For readers that rebuild their whole state from the log on every start (the metrics sink): they
keep no position, so nothing is committed, and a stop reads on to every partition's end first.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator, Sequence

from dart.bus.config import BusConfig
from dart.errors import DecodeError
from dart.events import Event, decode

log = logging.getLogger(__name__)


def follow_topics(bus: BusConfig, topics: Sequence[str], *, stop: threading.Event, stop_timeout_s: float,
                  group: str, poll_s: float = 0.5) -> Iterator[tuple[str, Event] | None]:
    """Yield ``(topic, event)`` for every record of ``topics`` (full names) from offset 0, and
    ``None`` after each poll (so a caller can flush on time, not only on records). Once ``stop`` is
    set, reads on until every partition reported its end or ``stop_timeout_s`` passed. Records
    that do not decode are skipped: the consumers that own the topic dead-letter them."""
    from confluent_kafka import OFFSET_BEGINNING, KafkaError, TopicPartition
    from confluent_kafka import Consumer as KafkaConsumer

    eof = getattr(KafkaError, "_PARTITION_EOF")  # noqa: B009 - librdkafka's local codes start with "_"
    consumer = KafkaConsumer(bus.librdkafka(**{
        "group.id": group,   # required by the client; nothing is committed
        "enable.auto.commit": False, "enable.partition.eof": True, "fetch.wait.max.ms": 500,
        "fetch.message.max.bytes": bus.max_message_bytes,
        "logger": logging.getLogger("dart.bus.rdkafka")}))
    try:
        meta = consumer.list_topics(timeout=10.0)
        parts = [TopicPartition(t, p, OFFSET_BEGINNING) for t in topics if t in meta.topics
                 for p in sorted(meta.topics[t].partitions)]
        consumer.assign(parts)
        at_end: set[tuple[str, int]] = set()
        stop_deadline = None
        while True:
            for msg in consumer.consume(num_messages=1000, timeout=poll_s):
                key = (msg.topic(), msg.partition())
                err = msg.error()
                if err is not None:
                    if err.code() == eof:
                        at_end.add(key)
                    else:
                        log.warning("follow: fetch from %s[%d]: %s", key[0], key[1], err)
                    continue
                at_end.discard(key)
                try:
                    event = decode(msg.value())
                except DecodeError:
                    continue
                yield key[0], event
            yield None
            if stop.is_set():
                stop_deadline = stop_deadline or time.monotonic() + stop_timeout_s
                if len(at_end) >= len(parts) or time.monotonic() > stop_deadline:
                    return
    finally:
        consumer.close()
