"""Kafka plumbing: topics, producer, consumer, request-reply, the dev broker."""

from dart.bus.broker import DevBroker, broker_answers, ensure_topics, free_port, tansu_binary
from dart.bus.config import BusConfig, BusSecurity
from dart.bus.consumer import SLOW_FETCH_WAIT_MS, Consumer, read_topic, stop_on_signals
from dart.bus.producer import REPLY_TO_HEADER, Producer, RecordMeta
from dart.bus.records import Delivered, dead_letter
from dart.bus.reply import ReplyInbox, reply_partition
from dart.bus.topics import CATALOGUE, Topics, TopicSpec
from dart.bus.unordered import OffsetWatermark, Taken, UnorderedConsumer

__all__ = [
    "CATALOGUE",
    "REPLY_TO_HEADER",
    "SLOW_FETCH_WAIT_MS",
    "BusConfig",
    "BusSecurity",
    "Consumer",
    "Delivered",
    "DevBroker",
    "OffsetWatermark",
    "Producer",
    "RecordMeta",
    "ReplyInbox",
    "Taken",
    "TopicSpec",
    "Topics",
    "UnorderedConsumer",
    "broker_answers",
    "dead_letter",
    "ensure_topics",
    "free_port",
    "read_topic",
    "reply_partition",
    "stop_on_signals",
    "tansu_binary",
]
