"""The event log on a real Kafka-protocol broker (Tansu, started by the suite)."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable
from pathlib import Path

import pytest

from dart.bus import BusConfig, Consumer, Producer, ReplyInbox, read_topic, reply_partition
from dart.errors import BusError
from dart.events import ObservationEmitted, WorkerHeartbeat, decode, encode
from dart.events.examples import action_chosen, all_examples

pytestmark = pytest.mark.kafka
HERE = Path(__file__).parent


def heartbeat(i: int, worker: str = "w") -> WorkerHeartbeat:
    return WorkerHeartbeat.new(run_id="test", producer=worker, worker_id=f"{worker}{i % 7}", role="env",
                               state="running", host="h", pid=1, slots=8, slots_busy=i % 8, busy_s=float(i),
                               idle_s=0.0, uptime_s=float(i))


async def read_all(cfg: BusConfig, topic: str) -> list:
    return [d async for d in read_topic(cfg, topic, idle_timeout_s=3.0)]


async def test_every_event_type_round_trips_through_kafka(bus: BusConfig):
    producer = Producer(bus)
    examples = all_examples()
    for event in examples:
        await producer.send(event)
    producer.close()
    seen = []
    for topic in bus.topics.all():
        seen += [d.event for d in await read_all(bus, topic)]
    assert sorted(seen, key=lambda e: e.event_id) == sorted(examples, key=lambda e: e.event_id)


async def test_records_are_keyed_by_the_catalogue_key(bus: BusConfig):
    producer = Producer(bus)
    await producer.send(heartbeat(3))
    producer.close()
    (d,) = await read_all(bus, bus.topics.heartbeats)
    assert d.key == b"w3"


async def test_garbage_goes_to_the_dlq_with_its_bytes_and_the_consumer_carries_on(bus: BusConfig):
    producer = Producer(bus)
    good = [heartbeat(i) for i in range(3)]
    await producer.send(good[0], partition=0)
    bad = await producer.send_raw(b"\xc3\x01garbage!", bus.topics.heartbeats, b"k", partition=0)
    await producer.send(good[1], partition=0)
    await producer.send_raw(b"not avro at all", bus.topics.heartbeats, None, partition=0)
    await producer.send(good[2], partition=0)
    handled = []

    async def handle(d):
        handled.append(d.event.event_id)

    consumer = Consumer(bus, topics=[bus.topics.heartbeats], group="dlq-test", handler=handle, producer=producer)
    task = asyncio.create_task(consumer.run())
    await _until(lambda: len(handled) == 3)
    consumer.stop()
    await task
    assert handled == [e.event_id for e in good]
    letters = [d.event for d in await read_all(bus, bus.topics.dlq)]
    assert len(letters) == 2
    first = letters[0]
    assert (first.source_topic, first.partition, first.offset) == (bus.topics.heartbeats, 0, bad.offset)
    assert first.value == b"\xc3\x01garbage!" and first.key == b"k"
    assert first.stage == "decode" and first.error_type == "DecodeError"
    assert "unknown schema fingerprint" in first.error
    producer.close()


async def test_a_failing_handler_is_retried_then_dead_lettered(bus: BusConfig):
    producer = Producer(bus)
    events = [heartbeat(i) for i in range(3)]
    for e in events:
        await producer.send(e, partition=0)
    calls: dict[str, int] = {}
    done = []

    async def handle(d):
        calls[d.event.event_id] = calls.get(d.event.event_id, 0) + 1
        if d.event.event_id == events[1].event_id:
            raise RuntimeError("handler cannot cope")
        done.append(d.event.event_id)

    consumer = Consumer(bus, topics=[bus.topics.heartbeats], group="retry", handler=handle, handler_retries=2,
                        retry_backoff_s=0.01, producer=producer)
    task = asyncio.create_task(consumer.run())
    await _until(lambda: len(done) == 2)
    consumer.stop()
    await task
    assert calls[events[1].event_id] == 3
    (letter,) = [d.event for d in await read_all(bus, bus.topics.dlq)]
    assert letter.stage == "handle" and letter.error == "handler cannot cope"
    assert decode(letter.value) == events[1]
    producer.close()


def test_a_consumer_killed_mid_stream_resumes_with_nothing_lost_and_no_effect_twice(bus: BusConfig, tmp_path):
    producer = Producer(bus)
    events = [heartbeat(i) for i in range(120)]
    for e in events:
        producer.send_nowait(e)
    producer.close()
    out = tmp_path / "handled.txt"
    cmd = [sys.executable, str(HERE / "consume_proc.py"), bus.bootstrap, bus.prefix, str(out), "0.01"]
    first = subprocess.Popen(cmd)
    _wait_for(lambda: out.exists() and len(out.read_text().split()) >= 40, timeout_s=30)
    first.send_signal(signal.SIGKILL)
    first.wait()
    after_kill = out.read_text().split()
    assert 40 <= len(after_kill) < 120, "kill the consumer mid-stream"
    second = subprocess.Popen(cmd)
    try:
        _wait_for(lambda: set(out.read_text().split()) >= {e.event_id for e in events}, timeout_s=40)
    finally:
        second.send_signal(signal.SIGTERM)
        second.wait(20)
    handled = out.read_text().split()
    # Nothing lost: every event had its effect. The effect (a set of ids) is idempotent, and only
    # the uncommitted tail of the killed consumer (< one fetch of max_batch=10 per partition) is redone.
    assert set(handled) == {e.event_id for e in events}
    redone = len(handled) - len(set(handled))
    assert redone <= 2 * 10, f"{redone} records redone: the restart did not resume from committed offsets"


def test_sigterm_finishes_the_record_in_hand_commits_and_exits(bus: BusConfig, tmp_path):
    producer = Producer(bus)
    events = [heartbeat(i) for i in range(6)]
    for e in events:
        producer.send_nowait(e, partition=0)
    producer.close()
    out = tmp_path / "handled.txt"
    cmd = [sys.executable, str(HERE / "consume_proc.py"), bus.bootstrap, bus.prefix, str(out), "0.5"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    _wait_for(lambda: out.exists() and len(out.read_text().split()) >= 1, timeout_s=30)
    proc.send_signal(signal.SIGTERM)
    stdout, _ = proc.communicate(timeout=20)
    assert proc.returncode == 0 and "clean exit" in stdout
    handled_first = out.read_text().split()
    # Restart: the committed position means nothing handled before SIGTERM is handled again.
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    _wait_for(lambda: len(out.read_text().split()) >= len(events), timeout_s=30)
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=20)
    handled = out.read_text().split()
    assert sorted(handled) == sorted(e.event_id for e in events), "no duplicates, nothing lost"
    assert len(handled_first) < len(events)


async def test_replay_from_the_earliest_offset_rebuilds_identical_state(bus: BusConfig):
    producer = Producer(bus)
    for i in range(50):
        producer.send_nowait(heartbeat(i))
    producer.close()

    def fold(state: dict, event: WorkerHeartbeat) -> None:
        state[event.worker_id] = max(state.get(event.worker_id, 0.0), event.busy_s)

    live: dict = {}
    count = 0

    async def handle(d):
        nonlocal count
        fold(live, d.event)
        count += 1

    consumer = Consumer(bus, topics=[bus.topics.heartbeats], group="live", handler=handle)
    task = asyncio.create_task(consumer.run())
    await _until(lambda: count == 50)
    consumer.stop()
    await task
    replayed: dict = {}
    for d in await read_all(bus, bus.topics.heartbeats):
        fold(replayed, d.event)
    assert replayed == live and len(live) == 7


async def test_a_5mb_screenshot_rides_the_blob_store_and_the_event_stays_small(bus: BusConfig, blobs):
    screenshot = os.urandom(5 * 1024 * 1024)
    digest = blobs.put(screenshot)
    base = next(e for e in all_examples() if isinstance(e, ObservationEmitted))
    obs = dataclasses.replace(base, screenshot_digest=digest)
    assert len(encode(obs)) < 1024
    producer = Producer(bus)
    await producer.send(obs)
    producer.close()
    (d,) = await read_all(bus, bus.topics.observations)
    assert blobs.get(d.event.screenshot_digest) == screenshot


async def test_replies_reach_only_the_env_worker_that_asked(bus: BusConfig):
    partitions = 4
    # Two workers that share a reply partition, so filtering by the reply-to header matters.
    a = "env-a"
    b = next(f"env-b{i}" for i in range(1000) if reply_partition(f"env-b{i}", partitions) == reply_partition(a, 4))
    producer = Producer(bus)
    inbox_a, inbox_b = ReplyInbox(bus, a, producer=producer), ReplyInbox(bus, b, producer=producer)
    await inbox_a.start()
    await inbox_b.start()
    assert inbox_a.route.partition == inbox_b.route.partition
    answer = action_chosen()
    fut_b = inbox_b.expect(answer.in_reply_to)
    await producer.reply(inbox_a.route, answer)
    got = await inbox_a.wait(answer.in_reply_to, timeout_s=10)
    assert got == answer
    await asyncio.sleep(0.3)
    assert not fut_b.done() and inbox_b.ignored >= 1
    with pytest.raises(TimeoutError):
        await inbox_b.wait(answer.in_reply_to, timeout_s=0.2)
    await inbox_a.close()
    await inbox_b.close()
    producer.close()


async def test_a_follower_reads_every_topic_on_to_the_end_once_told_to_stop(bus: BusConfig):
    """``read_topic(follow=...)`` as the metrics sink follows: several topics from their first
    offsets, ``after_fetch`` after every fetch (empty ones too: the sink flushes on time), and once
    ``follow`` turns false, on to the end of the log (what was acknowledged before is read) and out."""
    producer = Producer(bus)
    producer.send_nowait(action_chosen())
    for i in range(10):
        producer.send_nowait(heartbeat(i))
    producer.flush()
    stop = asyncio.Event()
    fetches = 0

    def fetched() -> None:
        nonlocal fetches
        fetches += 1

    async def write_then_stop() -> None:
        await asyncio.sleep(0.5)  # the follower is at the end, fetching nothing
        for i in range(10, 15):
            producer.send_nowait(heartbeat(i))
        await producer.aflush()
        stop.set()  # at once: these five are on the log, not yet read

    writer = asyncio.create_task(write_then_stop())
    follower = read_topic(bus, [bus.topics.actions, bus.topics.heartbeats], follow=lambda: not stop.is_set(),
                          end_timeout_s=10, after_fetch=fetched)
    got = await asyncio.wait_for(_collect(follower), timeout=20)
    await writer
    producer.close()
    assert sorted(e.uptime_s for e in got if isinstance(e, WorkerHeartbeat)) == [float(i) for i in range(15)]
    assert sum(not isinstance(e, WorkerHeartbeat) for e in got) == 1
    assert fetches >= 3  # the half second at the end was fetched through, not waited out


async def _collect(events) -> list:  # type: ignore[no-untyped-def]
    return [d.event async for d in events]


def test_flush_raises_when_records_cannot_be_acknowledged():
    from dart.bus import free_port

    cfg = BusConfig(bootstrap=f"127.0.0.1:{free_port()}", prefix="nobody")
    producer = Producer(cfg)
    producer.send_nowait(heartbeat(0))
    t0 = time.monotonic()
    with pytest.raises(BusError, match="not acknowledged"):
        producer.flush(timeout_s=1.0)
    assert time.monotonic() - t0 < 5
    with pytest.raises(BusError, match="not acknowledged"):
        producer.close(timeout_s=0.1)  # still says so, and leaves no client retrying in the background


async def test_a_lingering_raw_consumer_gathers_fetches_into_one_call_in_log_order(bus: BusConfig):
    producer = Producer(bus)
    calls: list[list[int]] = []

    async def handle(records):
        calls.append([r.offset for r in records])
        return []

    consumer = Consumer(bus, topics=[bus.topics.heartbeats], group="linger", raw_batch_handler=handle,
                        linger_s=3.0, producer=producer)
    task = asyncio.create_task(consumer.run())
    await consumer.started.wait()
    await asyncio.sleep(1.0)  # the group's first fetch position is settled
    for _burst in range(2):  # two bursts, each its own fetch, 0.5 s apart: within one linger
        for i in range(3):
            await producer.send(heartbeat(i), partition=0)
        await asyncio.sleep(0.5)
    await _until(lambda: sum(map(len, calls)) >= 6)
    consumer.stop()
    await task
    assert len(calls) == 1 and len(calls[0]) == 6
    assert calls[0] == sorted(calls[0])
    producer.close()


async def _until(cond, timeout_s: float = 30.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not cond():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.02)


def _wait_for(cond, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(0.05)


async def test_a_too_large_record_is_refused_at_produce_time_with_the_setting_to_change(bus: BusConfig):
    small = dataclasses.replace(bus, max_message_bytes=4096)
    producer = Producer(small)
    try:
        with pytest.raises(BusError, match=r"over bus.max_message_bytes \(4096\).*blob store"):
            await producer.send_raw(b"x" * 5000, bus.topics.heartbeats)
        with pytest.raises(BusError, match="max_message_bytes"):
            producer.send_nowait(dataclasses.replace(heartbeat(0), info={"blob": "y" * 5000}))
        await producer.send(heartbeat(1))  # the producer still works
    finally:
        producer.close()


def test_a_dead_letter_keeps_at_most_its_budget_of_the_original_bytes():
    from types import SimpleNamespace

    from dart.bus import dead_letter

    rec = SimpleNamespace(value=b"z" * 100, key=b"k", topic="t", partition=1, offset=7)
    letter = dead_letter(rec, run_id="r", producer="p", group="g", stage="decode", exc=ValueError("bad"),
                         max_value_bytes=10)
    assert letter.value == b"z" * 10 and "cut from 100 to 10 bytes" in letter.error and letter.offset == 7
    whole = dead_letter(rec, run_id="r", producer="p", group="g", stage="decode", exc=ValueError("bad"),
                        max_value_bytes=1000)
    assert whole.value == rec.value and whole.error == "bad"


async def test_a_consumer_knows_it_replayed_the_log_while_producers_keep_writing(bus: BusConfig):
    producer = Producer(bus)
    for i in range(50):
        producer.send_nowait(heartbeat(i))
    producer.flush()
    seen: list[int] = []

    async def handle(d) -> None:  # type: ignore[no-untyped-def]
        seen.append(d.offset)

    consumer = Consumer(bus, topics=[bus.topics.heartbeats], group="catch-up", handler=handle, producer=producer)
    run = asyncio.create_task(consumer.run())

    async def keep_writing() -> None:  # a record every 50 ms: the log never goes quiet
        for i in range(400):
            await producer.send(heartbeat(i))
            await asyncio.sleep(0.05)

    writer = asyncio.create_task(keep_writing())
    await asyncio.wait_for(consumer.reached_end.wait(), timeout=20)
    assert len(seen) >= 50
    assert not writer.done()
    writer.cancel()
    consumer.stop()
    await asyncio.gather(run, writer, return_exceptions=True)
    producer.close()


async def test_a_pipelined_consumer_fetches_on_while_a_fetch_is_handled_and_commits_in_log_order(bus: BusConfig):
    """``pipeline_records``: records that arrive while an earlier fetch is still being handled are
    handled at once (the rollout worker's engine batches them), and offsets are committed only up
    to the oldest fetch not finished yet."""
    producer = Producer(bus)
    release = asyncio.Event()
    handled: list[int] = []

    async def handle(batch) -> None:  # type: ignore[no-untyped-def]
        if batch[0].offset == 0:
            await release.wait()  # the first fetch is slow
        handled.extend(d.offset for d in batch)

    topic = bus.topics.heartbeats
    consumer = Consumer(bus, topics=[topic], group="pipelined", batch_handler=handle, producer=producer,
                        pipeline_records=100)
    run = asyncio.create_task(consumer.run())
    await consumer.started.wait()
    await producer.send(heartbeat(0), partition=0)
    await asyncio.sleep(1.0)  # fetched, and held by the handler
    for i in range(1, 4):
        await producer.send(heartbeat(i), partition=0)
    await _until(lambda: len(handled) == 3)  # handled while offset 0 is still in hand

    def committed() -> Awaitable[int | None]:
        return committed_offset(bus, "pipelined", topic)

    assert sorted(handled) == [1, 2, 3]
    assert await committed() is None  # nothing before the slow fetch is done
    release.set()
    await _until(lambda: consumer.handled == 4)
    assert await committed() == 4
    consumer.stop()
    await run
    producer.close()


async def test_commit_when_holds_offsets_back_until_the_effect_is_durable_and_a_restart_gets_them_again(
        bus: BusConfig):
    """The trainer's full checkpoints: a record's offset is committed only once ``commit_when`` says
    the effect of every record up to it is durable; the held-back ones come again after a restart."""
    producer = Producer(bus)
    topic, handled = bus.topics.heartbeats, []

    async def handle(d) -> None:  # type: ignore[no-untyped-def]
        handled.append(d.offset)

    def committed() -> Awaitable[int | None]:
        return committed_offset(bus, "gated", topic)

    def durable() -> bool:  # a full checkpoint after every third record
        return bool(handled) and handled[-1] % 3 == 2

    consumer = Consumer(bus, topics=[topic], group="gated", handler=handle, producer=producer, commit_when=durable)
    run = asyncio.create_task(consumer.run())
    for i in range(5):
        await producer.send(heartbeat(i), partition=0)
    await _until(lambda: len(handled) == 5)
    assert await committed() is None  # offset 4 handled, not durable
    await producer.send(heartbeat(5), partition=0)
    await _until(lambda: len(handled) == 6)
    await _until_async(committed, 6)
    for i in (6, 7):
        await producer.send(heartbeat(i), partition=0)
    await _until(lambda: len(handled) == 8)
    consumer.stop()
    await run
    assert await committed() == 6  # the stop did not commit what is not durable

    again: list[int] = []

    async def collect(d) -> None:  # type: ignore[no-untyped-def]
        again.append(d.offset)

    restarted = Consumer(bus, topics=[topic], group="gated", handler=collect, producer=producer)
    run = asyncio.create_task(restarted.run())
    await _until(lambda: len(again) == 2)
    restarted.stop()
    await run
    assert again == [6, 7]
    with pytest.raises(ValueError, match="commit_when works with a handler or a batch_handler"):
        Consumer(bus, topics=[topic], group="g", batch_handler=handle, pipeline_records=10, commit_when=durable)
    producer.close()


async def committed_offset(bus: BusConfig, group: str, topic: str) -> int | None:
    """The offset ``group`` committed on partition 0 of ``topic`` (None: nothing yet)."""
    from aiokafka import AIOKafkaConsumer, TopicPartition

    probe = AIOKafkaConsumer(**bus.aiokafka(group_id=bus.group_id(group), enable_auto_commit=False))
    await probe.start()
    try:
        return await probe.committed(TopicPartition(topic, 0))
    finally:
        await probe.stop()


async def _until_async(probe, expected, timeout_s: float = 20.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while (got := await probe()) != expected:
        assert time.monotonic() < deadline, f"got {got}, waited for {expected}"
        await asyncio.sleep(0.1)


def test_pipeline_records_needs_a_batch_handler(bus: BusConfig):
    async def one(d) -> None:  # type: ignore[no-untyped-def]
        return None

    with pytest.raises(ValueError, match="pipeline_records needs a batch_handler"):
        Consumer(bus, topics=[bus.topics.heartbeats], group="g", handler=one, pipeline_records=10)


async def test_a_stopping_consumer_takes_in_hand_every_record_acknowledged_before_it_asked(bus: BusConfig):
    """The data manager's drain: records sent after the log was read to its end (the batcher's last
    batch as the stop comes) are fetched and handled before the consumer stops, with no idle gap."""
    producer = Producer(bus)
    seen: list[tuple[int, int]] = []

    async def handle(d) -> None:  # type: ignore[no-untyped-def]
        await asyncio.sleep(0.02)  # a slow projection
        seen.append((d.partition, d.offset))

    consumer = Consumer(bus, topics=[bus.topics.heartbeats], group="drain", handler=handle, producer=producer)
    run = asyncio.create_task(consumer.run())
    await asyncio.wait_for(consumer.started.wait(), timeout=20)
    for i in range(30):
        await producer.send(heartbeat(i))
    t0 = time.monotonic()
    assert await consumer.fetched_to_end(timeout_s=20)
    waited = time.monotonic() - t0
    consumer.stop()
    await asyncio.wait_for(run, timeout=20)
    producer.close()
    assert len(seen) == len(set(seen)) == 30
    assert waited < 10


async def test_a_runs_groups_carry_its_prefix_on_the_broker_and_a_slow_join_is_reported(bus: BusConfig, caplog):
    """Two runs on one broker never share a consumer group: the broker knows this run's group
    ``g`` as ``<prefix>.g``. A member still waiting for partitions says so, once per interval."""
    from aiokafka import AIOKafkaConsumer, TopicPartition

    waiting = Consumer(bus, topics=[bus.topics.heartbeats], group="g", handler=lambda d: asyncio.sleep(0))
    with caplog.at_level("WARNING", logger="dart.bus.consumer"):
        watch = asyncio.create_task(waiting._join_watch(every_s=0.05))
        await asyncio.sleep(0.18)
        waiting.started.set()
        await asyncio.wait_for(watch, 1)
    said = [r.getMessage() for r in caplog.records if "no partitions after" in r.getMessage()]
    assert 2 <= len(said) <= 4 and f"the group {bus.prefix}.g is still rebalancing" in said[0]

    member = Consumer(bus, topics=[bus.topics.heartbeats], group="g", handler=lambda d: asyncio.sleep(0))
    task = asyncio.create_task(member.run())
    await asyncio.wait_for(member.started.wait(), 30)
    producer = Producer(bus)
    await producer.send(heartbeat(0), partition=0)
    producer.close()
    await _until(lambda: member.handled == 1)  # handled and committed
    member.stop()
    await asyncio.wait_for(task, 15)

    async def committed(group_id: str) -> int | None:
        probe = AIOKafkaConsumer(**bus.aiokafka(group_id=group_id, enable_auto_commit=False))
        await probe.start()
        try:
            return await probe.committed(TopicPartition(bus.topics.heartbeats, 0))
        finally:
            await probe.stop()

    assert await committed(f"{bus.prefix}.g") == 1
    assert await committed("g") is None
