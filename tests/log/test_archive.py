"""The archive of the log on a real broker: written continuously, read by plain fastavro and by
ClickHouse, verified, and republished into a fresh broker at the same offsets."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import fastavro
import pytest
from confluent_kafka import Consumer as KafkaConsumer
from confluent_kafka import TopicPartition

from dart.bus import BusConfig, DevBroker, Producer, ensure_topics
from dart.events import DeadLetter, WorkerHeartbeat, decode
from dart.events.examples import all_examples
from dart.log.archiver import GROUPS_FILE, Archiver, ArchiverConfig, merge_plan, size_class
from dart.log.check import listing, verify
from dart.log.restore import end_offsets, import_archive
from dart.log.segments import ArchiveError, list_segments, read_partition, repair, write_segment

pytestmark = pytest.mark.kafka
REPO = Path(__file__).resolve().parents[2]


def heartbeat(i: int) -> WorkerHeartbeat:
    return WorkerHeartbeat.new(run_id="t", producer="w", worker_id=f"w{i % 5}", role="env", state="running",
                               host="h", pid=1, slots=8, slots_busy=i % 8, busy_s=float(i), idle_s=0.0,
                               uptime_s=float(i))


def produce(bus: BusConfig, events, *, garbage: int = 0) -> None:
    with Producer(bus) as p:
        for e in events:
            p.send_nowait(e, headers={"dart-type": type(e).__name__.encode()})
        for i in range(garbage):
            p.send_raw_nowait(b"\x00not avro %d" % i, bus.topics.heartbeats, key=b"junk", partition=0)
        p.flush()


def archive(bus: BusConfig, log_dir: Path, **kw) -> dict[str, int]:
    return Archiver(ArchiverConfig(log_dir=log_dir, fsync=False, **kw), bus).run(until_caught_up=True)


def raw_records(bus: BusConfig, topic: str, partitions: int) -> list[tuple]:
    """(partition, offset, key, value, headers, timestamp) of every record, read without dart code."""
    ends = end_offsets(bus, [(topic, p) for p in range(partitions)])
    c = KafkaConsumer({"bootstrap.servers": bus.bootstrap, "group.id": "raw-reader", "enable.auto.commit": False})
    c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    out, want = [], sum(ends.values())
    deadline = time.monotonic() + 20
    while len(out) < want and time.monotonic() < deadline:
        for m in c.consume(1000, timeout=0.2):
            if m.error() is None:
                out.append((m.partition(), m.offset(), m.key(), m.value(), m.headers(), m.timestamp()[1]))
    c.close()
    return sorted(out, key=lambda r: (r[0], r[1]))


# ------------------------------------------------------------------ pure


def test_size_classes_and_merge_plan_by_hand():
    assert [size_class(n, 10) for n in (1, 9, 10, 99, 100, 999, 1000)] == [0, 0, 1, 1, 2, 2, 3]
    assert merge_plan([3] * 9, 10, 1000) == 0             # not enough files yet
    assert merge_plan([3] * 10, 10, 1000) == 10           # ten of class 0 -> one file
    assert merge_plan([500, *[3] * 9], 10, 1000) == 0     # the run of class 0 is only nine long
    assert merge_plan([50] * 10, 10, 400) == 0            # the result would pass the file limit
    assert merge_plan([40, 30, *[20] * 8], 10, 1000) == 10


def test_repair_removes_temp_files_and_files_a_merge_already_holds(tmp_path):
    recs = [{"topic": "t.x", "partition": 0, "offset": i, "timestamp": 1, "key": None, "headers": [],
             "event_type": None, "value": b"v"} for i in range(6)]
    write_segment(tmp_path, "t.x", 0, recs[:3], fsync=False)
    write_segment(tmp_path, "t.x", 0, recs[3:], fsync=False)
    merged = write_segment(tmp_path, "t.x", 0, recs, fsync=False)   # a merge that died before unlinking
    (merged.path.parent / ".00000000000000000006-x.avro.tmp").write_bytes(b"half")
    removed = repair(tmp_path)
    assert len(removed) == 3
    (segs,) = list_segments(tmp_path).values()
    assert [(s.first, s.last) for s in segs] == [(0, 5)]
    assert [r["offset"] for r in read_partition(segs)] == list(range(6))


# ------------------------------------------------------------------ on the broker


def test_every_topic_is_archived_as_plain_avro_with_its_kafka_coordinates(bus: BusConfig, tmp_path):
    events = all_examples() + [heartbeat(i) for i in range(300)]
    produce(bus, events, garbage=2)
    counts = archive(bus, tmp_path / "log")
    assert sum(counts.values()) == len(events) + 2

    files = sorted((tmp_path / "log").rglob("*.avro"))
    assert files and not list((tmp_path / "log").rglob("*.tmp"))
    seen = []
    for f in files:  # plain fastavro, no dart code: the writer schema is in the file
        with open(f, "rb") as fh:
            reader = fastavro.reader(fh)
            assert reader.writer_schema["name"] == "dart.log.ArchivedRecord"
            seen += list(reader)
    assert len(seen) == len(events) + 2
    raw = raw_records(bus, bus.topics.heartbeats, 2)
    archived = sorted((r["partition"], r["offset"], r["key"], r["value"]) for r in seen
                       if r["topic"] == bus.topics.heartbeats)
    assert archived == [r[:4] for r in raw]
    hb = next(r for r in seen if r["event_type"] == "WorkerHeartbeat")
    assert {"key": "dart-type", "value": b"WorkerHeartbeat"} in hb["headers"]
    assert sum(r.records for r in listing(tmp_path / "log")) == len(events) + 2


def test_verify_fails_on_garbage_unless_the_run_dead_lettered_it(bus: BusConfig, tmp_path):
    produce(bus, [heartbeat(i) for i in range(20)], garbage=1)
    archive(bus, tmp_path / "log")
    verdict = verify(tmp_path / "log")
    assert not verdict.ok and "does not decode" in verdict.problems[0]
    (junk,) = [r for segs in list_segments(tmp_path / "log").values() for r in read_partition(segs)
               if r["key"] == b"junk"]
    letter = DeadLetter.new(run_id="t", producer="dm", source_topic=junk["topic"], partition=junk["partition"],
                            offset=junk["offset"], key=b"junk", value=junk["value"], stage="decode",
                            error_type="DecodeError", error="not avro", consumer_group="data-manager")
    produce(bus, [letter])
    archive(bus, tmp_path / "log")
    verdict = verify(tmp_path / "log")
    assert verdict.ok and verdict.records == 22 and len(verdict.dead_lettered) == 1


def test_a_truncated_file_is_named_with_the_last_good_offset(bus: BusConfig, tmp_path):
    produce(bus, [heartbeat(i) for i in range(3000)])
    archive(bus, tmp_path / "log", segment_records=1000)
    victim = max((tmp_path / "log").rglob("*.avro"), key=lambda p: p.stat().st_size)
    victim.write_bytes(victim.read_bytes()[: victim.stat().st_size // 2])
    verdict = verify(tmp_path / "log")
    assert not verdict.ok
    assert str(victim) in verdict.problems[0] and "after offset" in verdict.problems[0]
    (segs,) = [s for s in list_segments(tmp_path / "log").values() if any(x.path == victim for x in s)]
    with pytest.raises(ArchiveError, match=victim.name):
        list(read_partition(segs))
    # The replay reads through the same path: it stops with the error, it does not skip the file.
    from dart.data.replay import archived_events

    with pytest.raises(ArchiveError, match=victim.name):
        list(archived_events(tmp_path / "log"))


def test_a_clean_stop_leaves_one_file_per_partition_for_a_small_log(bus: BusConfig, tmp_path):
    log_dir = tmp_path / "log"
    for i in range(5):   # five archiver runs, five small files per partition, then merged on stop
        produce(bus, [heartbeat(i * 10 + j) for j in range(10)])
        archive(bus, log_dir)
    for segs in list_segments(log_dir).values():
        assert len(segs) == 1
    assert verify(log_dir).records == 50


def test_the_archive_resumes_where_its_files_end_and_never_writes_an_offset_twice(bus: BusConfig, tmp_path):
    produce(bus, [heartbeat(i) for i in range(100)])
    archive(bus, tmp_path / "log")
    produce(bus, [heartbeat(i) for i in range(100, 250)])
    second = archive(bus, tmp_path / "log")
    assert sum(second.values()) == 150
    verdict = verify(tmp_path / "log")
    assert verdict.ok and verdict.records == 250


def test_a_fresh_broker_rebuilt_from_the_archive_holds_the_same_records_at_the_same_offsets(bus, tmp_path):
    events = all_examples() + [heartbeat(i) for i in range(500)]
    produce(bus, events)
    with KafkaConsumer({"bootstrap.servers": bus.bootstrap, "group.id": "restore-me",
                        "enable.auto.commit": False}) as _:
        pass
    c = KafkaConsumer({"bootstrap.servers": bus.bootstrap, "group.id": "restore-me", "enable.auto.commit": False})
    c.commit(offsets=[TopicPartition(bus.topics.heartbeats, 0, 7)], asynchronous=False)
    c.close()
    archive(bus, tmp_path / "log")
    assert (tmp_path / "log" / GROUPS_FILE).exists()

    with DevBroker() as fresh:
        bus2 = BusConfig(bootstrap=fresh.bootstrap, prefix=bus.prefix)
        done = import_archive(tmp_path / "log", bus2)
        assert sum(done.records.values()) == len(events)
        assert raw_records(bus2, bus.topics.heartbeats, 2) == raw_records(bus, bus.topics.heartbeats, 2)
        c = KafkaConsumer({"bootstrap.servers": fresh.bootstrap, "group.id": "restore-me",
                           "enable.auto.commit": False})
        (tp,) = c.committed([TopicPartition(bus.topics.heartbeats, 0)], timeout=10)
        c.close()
        assert tp.offset == 7
        with pytest.raises(ArchiveError, match="already holds"):
            import_archive(tmp_path / "log", bus2)


def test_clickhouse_reads_the_archive_files_itself(bus: BusConfig, tmp_path):
    import chdb

    produce(bus, [heartbeat(i) for i in range(40)] + all_examples())
    archive(bus, tmp_path / "log")
    pattern = f"{tmp_path}/log/{bus.topics.heartbeats}/*/*.avro"
    out = chdb.query(f"SELECT event_type, count() FROM file('{pattern}', 'Avro') GROUP BY event_type "
                     f"ORDER BY event_type", "CSV").bytes().decode()
    assert out.splitlines() == ['"WeightsLoaded",1', '"WorkerHeartbeat",41']


def test_kill_9_of_the_archiver_mid_stream_leaves_no_gap_and_no_duplicate(bus: BusConfig, tmp_path):
    log_dir = tmp_path / "log"
    cmd = [sys.executable, "-m", "dart.cli", "archiver", "--bootstrap", bus.bootstrap, "--prefix", bus.prefix,
           "--log-dir", str(log_dir), "--flush-interval-s", "0.05"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    total = 0
    try:
        with Producer(bus) as p:
            for round_ in range(6):
                for i in range(400):
                    p.send_nowait(heartbeat(total + i))
                p.flush()
                total += 400
                time.sleep(0.3)
                if round_ in (1, 3):  # kill -9 while it is writing, then start it again
                    proc.send_signal(signal.SIGKILL)
                    proc.wait()
                    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and sum(r.records for r in listing(log_dir)) < total:
            time.sleep(0.2)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(10)
    verdict = verify(log_dir)
    assert verdict.ok, verdict.problems
    assert verdict.records == total
    offsets = [r["offset"] for segs in list_segments(log_dir).values() for r in read_partition(segs)]
    assert len(offsets) == total


def test_an_archiver_refuses_a_broker_that_holds_less_than_its_archive(tmp_path):
    with DevBroker() as b:
        bus = BusConfig(bootstrap=b.bootstrap, prefix="gone")
        ensure_topics(bus)
        produce(bus, [heartbeat(i) for i in range(10)])
        archive(bus, tmp_path / "log")
    with DevBroker() as b:   # restarted empty: the memory broker lost everything
        bus = BusConfig(bootstrap=b.bootstrap, prefix="gone")
        ensure_topics(bus)
        with pytest.raises(ArchiveError, match="restore the broker"):
            archive(bus, tmp_path / "log")
    assert decode is not None


def test_a_stopped_archiver_archives_up_to_the_end_of_the_log_first(bus: BusConfig, tmp_path):
    """stop() (SIGTERM) drains: what the broker holds when the archiver is told to stop is archived
    (a dev broker's log lives in memory; compose stops the archiver after the services that write).
    drain_s=0 stops at once, with nothing fetched."""
    produce(bus, [heartbeat(i) for i in range(300)])
    at_once = Archiver(ArchiverConfig(log_dir=tmp_path / "at-once", fsync=False, drain_s=0), bus)
    at_once.stop()
    assert at_once.run() == {}
    assert verify(tmp_path / "at-once").records == 0

    drained = Archiver(ArchiverConfig(log_dir=tmp_path / "drained", fsync=False, drain_s=60), bus)
    drained.stop()
    t0 = time.monotonic()
    assert drained.run() == {bus.topics.heartbeats: 300}
    assert time.monotonic() - t0 < 30  # it stopped at the log's end, not at the drain bound
    verdict = verify(tmp_path / "drained")
    assert verdict.ok and verdict.records == 300
