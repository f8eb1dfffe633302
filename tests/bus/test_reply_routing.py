"""Reply routing at scale: a reply partition per env worker, so no worker reads another's answers."""

from __future__ import annotations

import asyncio
import dataclasses
import uuid

import pytest

from dart.bus import BusConfig, Producer, ReplyInbox, ensure_topics
from dart.errors import ConfigError
from dart.events.examples import action_chosen

pytestmark = pytest.mark.kafka


def fresh(bus: BusConfig, actions_partitions: int) -> BusConfig:
    cfg = dataclasses.replace(bus, prefix=f"t{uuid.uuid4().hex[:10]}", partitions={"rollout.actions": actions_partitions})
    ensure_topics(cfg)
    return cfg


async def amplification(cfg: BusConfig, workers: int, *, assigned: bool, replies_each: int = 4) -> list[float]:
    """Every worker gets ``replies_each`` answers; the read amplification each inbox saw."""
    producer = Producer(cfg)
    inboxes = [ReplyInbox(cfg, f"env-{i}", producer=producer, partition=i if assigned else None)
               for i in range(workers)]
    for inbox in inboxes:
        await inbox.start()
    waits = []
    for inbox in inboxes:
        for _ in range(replies_each):
            answer = dataclasses.replace(action_chosen(), in_reply_to=str(uuid.uuid4()))
            waits.append(inbox.expect(answer.in_reply_to))
            await producer.reply(inbox.route, answer)
    await asyncio.wait_for(asyncio.gather(*waits), timeout=20)
    await asyncio.sleep(0.5)  # let every inbox read what else is on its partition
    out = [inbox.read_amplification for inbox in inboxes]
    for inbox in inboxes:
        await inbox.close()
    producer.close()
    return out


async def test_assigned_reply_partitions_read_nothing_meant_for_other_workers(bus: BusConfig):
    cfg = fresh(bus, actions_partitions=6)
    assigned = await amplification(cfg, 6, assigned=True)
    assert assigned == [1.0] * 6


async def test_hashed_reply_partitions_read_every_sharers_replies(bus: BusConfig):
    # The design before: 6 workers hashed onto 1 partition, each reads all 6 workers' answers
    # (and the others' start markers).
    cfg = fresh(bus, actions_partitions=1)
    hashed = await amplification(cfg, 6, assigned=False)
    assert min(hashed) >= 5.0


async def test_a_reply_partition_the_topic_does_not_have_names_the_setting(bus: BusConfig):
    inbox = ReplyInbox(bus, "env-9", partition=9)
    with pytest.raises(ConfigError, match=r"bus.partitions\['rollout.actions'\]"):
        await inbox.start()


def test_partitions_come_from_config_over_the_catalogue():
    cfg = BusConfig(partitions={"rollout.actions": 128})
    assert cfg.partitions_of("rollout.actions") == 128
    assert cfg.partitions_of("rollout.requests") == 4
    with pytest.raises(ConfigError, match=r"bus\.partitions\.nope"):
        BusConfig(partitions={"nope": 3})
    with pytest.raises(ConfigError, match="must be >= 1"):
        BusConfig(partitions={"weights": 0})
