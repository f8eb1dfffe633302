"""Event-log throughput: action-sized Avro events vs raw bytes of the same sizes.

Both paths go through the same dev broker in the same run, with the same producer and
consumer settings, as a stream: a producer process and a consumer process run at once (as an
env worker and a rollout worker would), and throughput is events delivered per second from
the first produce to the last consume. The Avro path includes encode (typed record ->
single-object Avro) in the producer and decode (bytes -> typed record) in the consumer; the
raw path moves opaque bytes of identical lengths. Goal: Avro keeps >= 0.8 of raw throughput.

    .venv/bin/python benchmarks/bus_throughput.py [--events 20000] [--tokens 120] [--passes 5]

Each side runs ``--passes`` times, raw and Avro alternating pass by pass; the figures are the
medians, their spread and the ratio of the medians (``benchmarks/passes.py``).
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import time

import passes  # benchmarks/passes.py: interleaved passes, medians, ratio of medians
from aiokafka import AIOKafkaConsumer, TopicPartition
from confluent_kafka import Producer as KafkaProducer
from confluent_kafka.admin import AdminClient, NewTopic

from dart.bus import DevBroker
from dart.events import decode, encode
from dart.events.examples import action_chosen


def produce(bootstrap: str, topic: str, payloads, *, encode_each: bool) -> float:
    p = KafkaProducer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all",
                       "linger.ms": 5, "batch.size": 1 << 20})
    t0 = time.perf_counter()
    for item in payloads:
        value = encode(item) if encode_each else item
        while True:
            try:
                p.produce(topic, value)
                break
            except BufferError:
                p.poll(0.01)
        p.poll(0)
    if p.flush(60):
        raise RuntimeError("records not acknowledged")
    return time.perf_counter() - t0


def _producer_proc(bootstrap: str, topic: str, payloads, encode_each: bool, go) -> None:  # type: ignore[no-untyped-def]
    go.wait()
    produce(bootstrap, topic, payloads, encode_each=encode_each)


async def consume(bootstrap: str, topic: str, n: int, *, decode_each: bool, go) -> float:  # type: ignore[no-untyped-def]
    c = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, fetch_max_wait_ms=20,
                         max_partition_fetch_bytes=8 << 20, fetch_max_bytes=32 << 20)
    await c.start()
    tp = TopicPartition(topic, 0)
    c.assign([tp])
    await c.seek_to_beginning(tp)
    seen = 0
    await c.getmany(timeout_ms=50)  # connected and fetching before the clock starts
    go.set()
    t0 = time.perf_counter()
    while seen < n:
        batch = await c.getmany(timeout_ms=500, max_records=5000)
        for records in batch.values():
            for rec in records:
                if decode_each:
                    decode(rec.value)
                seen += 1
    elapsed = time.perf_counter() - t0
    await c.stop()
    return elapsed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=20000)
    ap.add_argument("--tokens", type=int, default=120, help="response tokens per action event")
    ap.add_argument("--passes", type=int, default=passes.MIN_PASSES,
                    help="passes per side, raw and Avro interleaved pass by pass")
    args = ap.parse_args()

    events = [action_chosen(tokens=args.tokens, seed=i) for i in range(args.events)]
    sizes = [len(encode(e)) for e in events]
    raw = [os.urandom(s) for s in sizes]
    mb = sum(sizes) / 1e6
    print(f"{args.events} action events, mean {sum(sizes) / len(sizes):.0f} B ({mb:.1f} MB per pass), "
          f"{args.passes} passes per side, interleaved")
    with DevBroker() as broker:
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})

        def one_pass(kind: str, r: int) -> float:
            topic = f"bench.{kind}.{r}"
            for f in admin.create_topics([NewTopic(topic, 1, 1)]).values():
                f.result()
            avro = kind == "avro"
            ctx = multiprocessing.get_context("fork")
            go = ctx.Event()
            proc = ctx.Process(target=_producer_proc, args=(broker.bootstrap, topic,
                                                              events if avro else raw, avro, go))
            proc.start()
            total = asyncio.run(consume(broker.bootstrap, topic, args.events, decode_each=avro, go=go))
            proc.join(60)
            return args.events / total

        rates = passes.interleave({"raw": lambda r: one_pass("raw", r), "avro": lambda r: one_pass("avro", r)},
                                  args.passes, on_pass=passes.pass_line("events/s"))
    print(passes.report(rates, "events/s"))
    print(f"(MB/s: raw {rates['raw'].median * mb / args.events:.1f}, avro {rates['avro'].median * mb / args.events:.1f};"
          f" avro is encode+produce+consume+decode)")
    print(passes.ratio_line(rates, "avro", "raw", goal=0.8))


if __name__ == "__main__":
    main()
