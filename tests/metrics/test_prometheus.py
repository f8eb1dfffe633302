"""Prometheus metrics of the bus: a consumer's /metrics, scraped over HTTP and read with the client's
own parser, shows records in and out, handler latency, in-flight calls, dead letters and a lag
that falls to 0 once the group has read the log."""

from __future__ import annotations

import asyncio
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from dart.bus import BusConfig, Consumer, Producer
from dart.bus.prom import read_ports, start_exporter
from dart.events import WorkerHeartbeat

pytestmark = [pytest.mark.kafka]


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of http://127.0.0.1:PORT/metrics by (name, sorted labels)."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def value(samples: dict, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def beat(i: int) -> WorkerHeartbeat:
    return WorkerHeartbeat.new(run_id="t", producer="w", worker_id="w0", role="env", state="running", host="h",
                               pid=1, slots=1, slots_busy=0, busy_s=float(i), idle_s=0.0, uptime_s=float(i))


async def test_a_slow_consumer_shows_its_lag_falling_to_0_and_counts_everything(bus: BusConfig, tmp_path):
    port = start_exporter("probe-0", port_dir=tmp_path / "metrics")
    assert read_ports(tmp_path / "metrics") == {"probe-0": port}
    topic = bus.topics.heartbeats
    group = f"{bus.prefix}-slow"
    producer = Producer(bus)
    before = scrape(port)
    for i in range(40):
        producer.send_nowait(beat(i), partition=0)
    producer.send_raw_nowait(b"not avro", topic, None, partition=0)
    producer.flush()
    assert value(scrape(port), "dart_records_produced_total", topic=topic) - \
        value(before, "dart_records_produced_total", topic=topic) == 41

    handled = []

    async def handle(d):
        await asyncio.sleep(0.05)  # 41 records take ~2 s: the lag is seen while they wait
        handled.append(d)

    consumer = Consumer(bus, topics=[topic], group=group, handler=handle, producer=producer, max_batch=5)
    task = asyncio.create_task(consumer.run())
    lags, in_flight = [], []
    for _ in range(200):
        s = scrape(port)
        lags.append(value(s, "dart_consumer_lag", group=group, topic=topic, partition="0"))
        in_flight.append(value(s, "dart_in_flight", group=group))
        if len(handled) == 40 and lags[-1] == 0:
            break
        await asyncio.sleep(0.05)
    consumer.stop()
    await task
    s = scrape(port)
    assert max(lags) > 0 and lags[-1] == 0, lags
    assert max(in_flight) == 1 and value(s, "dart_in_flight", group=group) == 0
    assert value(s, "dart_records_consumed_total", group=group, topic=topic) == 41
    assert value(s, "dart_handler_seconds_count", group=group) == 40
    assert value(s, "dart_handler_seconds_sum", group=group) >= 40 * 0.05
    assert value(s, "dart_dead_letters_total", group=group, stage="decode") == 1
    producer.close()
