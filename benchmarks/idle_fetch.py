"""What an idle consumer costs the dev broker, by fetch wait; and what a long wait costs in latency.

Tansu holds an empty fetch for the consumer's whole ``fetch_max_wait_ms`` and does not answer it
early when a record arrives, so the wait trades broker CPU against delivery latency. dart keeps
the bus default (20 ms) for the env <-> rollout hot path and longer waits elsewhere
(``dart.bus.SLOW_FETCH_WAIT_MS``, ``data.projection.fetch_max_wait_ms``).

    .venv/bin/python benchmarks/idle_fetch.py [--waits 20 500] [--seconds 10]

2026-11-26, 2-core machine, nothing else running: four idle consumers (two on every topic, two
on one) cost the broker 41.0 % of a core at 20 ms and 3.7 % at 500 ms; a record sent at a random
moment reached a consumer waiting 20 ms in p50 11 ms, one waiting 500 ms in p50 189 ms.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dart.bus import BusConfig, Consumer, DevBroker, Producer, ensure_topics
from dart.events import WorkerHeartbeat


def cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def beat() -> WorkerHeartbeat:
    return WorkerHeartbeat.new(run_id="bench", producer="p", worker_id="w", role="env", state="running", host="h",
                               pid=1, slots=1, slots_busy=0, busy_s=0.0, idle_s=0.0, uptime_s=0.0)


async def idle_cost(wait_ms: int, seconds: float) -> float:
    """Broker CPU (fraction of a core) while four consumers wait on empty topics."""
    with DevBroker() as broker:
        cfg = BusConfig(bootstrap=broker.bootstrap, prefix="idle")
        ensure_topics(cfg)

        async def nothing(batch) -> None:  # type: ignore[no-untyped-def]
            return None

        consumers = [Consumer(cfg, topics=cfg.topics.all() if i < 2 else [cfg.topics.observations], group=f"g{i}",
                              batch_handler=nothing, fetch_max_wait_ms=wait_ms) for i in range(4)]
        tasks = [asyncio.create_task(c.run()) for c in consumers]
        for c in consumers:
            await c.started.wait()
        await asyncio.sleep(2.0)
        pid = broker._proc.pid  # type: ignore[union-attr]
        c0, t0 = cpu_s(pid), time.monotonic()
        await asyncio.sleep(seconds)
        share = (cpu_s(pid) - c0) / (time.monotonic() - t0)
        for c in consumers:
            c.stop()
        await asyncio.gather(*tasks, return_exceptions=True)
        return share


async def latency_ms(wait_ms: int, records: int = 30) -> float:
    """Median produce -> handler delay of records sent at random moments to a waiting consumer."""
    with DevBroker() as broker:
        cfg = BusConfig(bootstrap=broker.bootstrap, prefix="lat")
        ensure_topics(cfg)
        sent: dict[str, float] = {}
        delays: list[float] = []

        async def handle(batch) -> None:  # type: ignore[no-untyped-def]
            now = time.perf_counter()
            delays.extend(now - sent[d.event.event_id] for d in batch)

        consumer = Consumer(cfg, topics=[cfg.topics.heartbeats], group="g", batch_handler=handle,
                            fetch_max_wait_ms=wait_ms)
        task = asyncio.create_task(consumer.run())
        await consumer.started.wait()
        await asyncio.sleep(1.0)
        producer = Producer(cfg)
        for _ in range(records):
            await asyncio.sleep(random.uniform(0.05, 0.3))
            event = beat()
            sent[event.event_id] = time.perf_counter()
            producer.send_nowait(event, partition=0)
        await asyncio.sleep(1.5)
        consumer.stop()
        await task
        producer.close()
        delays.sort()
        return 1000 * delays[len(delays) // 2]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--waits", type=int, nargs="+", default=[20, 500])
    p.add_argument("--seconds", type=float, default=10.0)
    args = p.parse_args()
    rows = [(w, asyncio.run(idle_cost(w, args.seconds)), asyncio.run(latency_ms(w))) for w in args.waits]
    base = rows[0][1]
    print("| fetch wait | broker CPU, 4 idle consumers | vs first | delivery p50 |")
    print("|---|---|---|---|")
    for w, share, lat in rows:
        print(f"| {w} ms | {100 * share:.1f} % of a core | {share / base:.2f}x | {lat:.0f} ms |")


if __name__ == "__main__":
    main()
