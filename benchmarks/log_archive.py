"""The durable log's costs, each against a baseline measured in the same run:

1. produce throughput to the dev broker with the archiver running beside it vs without
   (the price of durability on one machine; Tansu's own storage is memory either way);
2. archiving (broker -> finished Avro files) in records/s;
3. replay from the archive: dart's read + decode of every event vs a plain ``fastavro.reader``
   of the same files (the goal: >= 50,000 events/s and >= 0.5x the plain read);
4. a full projection rebuild from the archive into a fresh chdb store, in events/s.

    .venv/bin/python benchmarks/log_archive.py [--events 100000]

The events are a realistic mix: per step one observation, one action (a 120-token answer with
its per-token arrays) and a heartbeat; per 8 steps a trajectory and a reward.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import threading
import time
from pathlib import Path

import fastavro

from dart.bus import BusConfig, DevBroker, Producer, ensure_topics
from dart.events import examples as ex
from dart.log.archiver import Archiver, ArchiverConfig


def event_mix(n: int) -> list:
    base = {type(e).__name__: e for e in ex.all_examples()}
    out = []
    i = 0
    while len(out) < n:
        out += [base["ObservationEmitted"], ex.action_chosen(seed=i % 50), base["WorkerHeartbeat"]]
        if i % 8 == 7:
            out += [base["TrajectoryFinished"], base["RewardAssigned"]]
        i += 1
    return out[:n]


def produce_rate(bus: BusConfig, events: list) -> float:
    t0 = time.perf_counter()
    with Producer(bus, linger_ms=5) as p:
        for e in events:
            p.send_nowait(e)
        p.flush()
    return len(events) / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--events", type=int, default=100_000)
    args = ap.parse_args()
    events = event_mix(args.events)
    work = Path(tempfile.mkdtemp(prefix="dart-bench-log-"))
    res: dict[str, float] = {"events": len(events)}
    try:
        with DevBroker() as broker:
            # 1. produce without, then with the archiver following the same broker.
            bus = BusConfig(bootstrap=broker.bootstrap, prefix="plain")
            ensure_topics(bus)
            res["produce_memory_eps"] = produce_rate(bus, events)
            bus = BusConfig(bootstrap=broker.bootstrap, prefix="durable")
            ensure_topics(bus)
            archiver = Archiver(ArchiverConfig(log_dir=work / "log"), bus)
            thread = threading.Thread(target=archiver.run, daemon=True)
            thread.start()
            res["produce_archived_eps"] = produce_rate(bus, events)
            t0 = time.perf_counter()
            while archiver.archived < len(events) and time.perf_counter() - t0 < 120:
                time.sleep(0.05)
            res["archive_catch_up_s"] = time.perf_counter() - t0
            archiver.stop()
            thread.join()
            res["archiver_max_lag_records"] = archiver.max_lag
            # 2. archiving alone: a fresh archive of the same topics, broker -> files.
            t0 = time.perf_counter()
            Archiver(ArchiverConfig(log_dir=work / "export"), bus).run(until_caught_up=True, idle_exit_s=0.5)
            res["archive_eps"] = len(events) / (time.perf_counter() - t0)

        files = sorted((work / "log").rglob("*.avro"))
        res["archive_bytes"] = sum(f.stat().st_size for f in files)
        res["files"] = len(files)
        # 3. plain fastavro read vs dart's replay read (read + decode every event).
        t0 = time.perf_counter()
        n = 0
        for f in files:
            with open(f, "rb") as fh:
                for _ in fastavro.reader(fh):
                    n += 1
        res["plain_read_eps"] = n / (time.perf_counter() - t0)
        from dart.data.replay import archived_events, rebuild_from_archive
        from dart.data.store import Store

        t0 = time.perf_counter()
        m = sum(1 for _ in archived_events(work / "log"))
        res["replay_decode_eps"] = m / (time.perf_counter() - t0)
        assert m == n == len(events), (m, n, len(events))
        # 4. the whole projection rebuilt from the archive.
        store = Store.open_dsn(f"chdb://{work / 'chdb'}", database="bench")
        t0 = time.perf_counter()
        rebuild_from_archive(work / "log", store)
        res["rebuild_eps"] = len(events) / (time.perf_counter() - t0)
        store.close()
    finally:
        shutil.rmtree(work, ignore_errors=True)

    res["produce_ratio"] = res["produce_archived_eps"] / res["produce_memory_eps"]
    res["replay_ratio"] = res["replay_decode_eps"] / res["plain_read_eps"]
    print(f"events                          {len(events):>12,}  ({res['archive_bytes'] / len(events):.0f} archived "
          f"bytes/event, {res['files']} files)")
    print(f"produce, memory broker           {res['produce_memory_eps']:>12,.0f} ev/s")
    print(f"produce, memory + archiver       {res['produce_archived_eps']:>12,.0f} ev/s   "
          f"ratio {res['produce_ratio']:.2f}")
    print(f"archiver most records unwritten {res['archiver_max_lag_records']:>12,}; caught up "
          f"{res['archive_catch_up_s']:.2f} s after the last ack")
    print(f"archive (broker -> files)        {res['archive_eps']:>12,.0f} ev/s")
    print(f"plain fastavro read              {res['plain_read_eps']:>12,.0f} ev/s")
    print(f"replay read + decode             {res['replay_decode_eps']:>12,.0f} ev/s   "
          f"ratio {res['replay_ratio']:.2f}  (goal >= 50,000 ev/s and >= 0.5)")
    print(f"projection rebuild from archive  {res['rebuild_eps']:>12,.0f} ev/s")
    print(json.dumps({k: round(v, 3) for k, v in res.items()}))


if __name__ == "__main__":
    main()
