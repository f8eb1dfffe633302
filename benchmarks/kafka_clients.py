"""Which Kafka client the consumers use: aiokafka against confluent-kafka (librdkafka) as dart's
consumers would run them, on asyncio, through the same dev broker in the same run.

- **consume**: events/s of reading ``--events`` action-sized Avro events (already on the log)
  from the first offset and decoding each, as ``read_topic`` and the projection do (the clock
  starts once the first record is in hand: connecting is not reading);
- **produce**: events/s of producing ``--events`` action-sized events with acks=all until the
  last is acknowledged (dart's idempotent ``Producer`` against ``AIOKafkaProducer``, which cannot
  be idempotent on the dev broker: the run says whether it starts);
- **reply round trip**: ms from producing a request until the answer to it is in hand, one at a
  time, where a responder reads the request topic and answers on the reply topic, and the asker
  reads the reply topic: two consumer hops per round trip (the env <-> rollout hot path).

aiokafka reads with ``getmany``; confluent-kafka with its asyncio consumer
(``confluent_kafka.aio.AIOConsumer``: each call runs the blocking client in a thread), ``consume``
for the throughput and ``poll`` for the round trip (``consume`` waits out its whole timeout when
fewer records than asked for are there). Both ask for the bus's ``fetch_max_wait_ms``; the
producer is dart's (confluent-kafka) on both sides.

    .venv/bin/python benchmarks/kafka_clients.py [--events 20000] [--trips 100] [--passes 5]

Sides run interleaved pass by pass; figures are medians, their spread and ratios of medians
(``benchmarks/passes.py``).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
import uuid

import passes  # benchmarks/passes.py: interleaved passes, medians, ratio of medians
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from confluent_kafka import OFFSET_BEGINNING
from confluent_kafka import TopicPartition as RdTopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from confluent_kafka.aio import AIOConsumer

from dart.bus import BusConfig, DevBroker, Producer
from dart.events import decode, encode
from dart.events.examples import action_chosen

CLIENTS = ("aiokafka", "confluent")


class Reader:
    """One partition read from the first offset, by either client; ``read()`` returns the next values."""

    def __init__(self, bus: BusConfig, client: str, topic: str, *, batch: int) -> None:
        self.bus, self.client, self.topic, self.batch = bus, client, topic, batch

    async def __aenter__(self) -> Reader:
        if self.client == "aiokafka":
            self.c = AIOKafkaConsumer(**self.bus.aiokafka(
                enable_auto_commit=False, fetch_max_wait_ms=self.bus.fetch_max_wait_ms,
                max_partition_fetch_bytes=self.bus.max_message_bytes))
            await self.c.start()
            tp = TopicPartition(self.topic, 0)
            self.c.assign([tp])
            await self.c.seek_to_beginning(tp)
        else:
            self.c = AIOConsumer(self.bus.librdkafka(**{
                "group.id": f"bench-{uuid.uuid4().hex[:6]}", "enable.auto.commit": False,
                "fetch.wait.max.ms": self.bus.fetch_max_wait_ms,
                "fetch.message.max.bytes": self.bus.max_message_bytes}), max_workers=2)
            await self.c.assign([RdTopicPartition(self.topic, 0, OFFSET_BEGINNING)])
        return self

    async def __aexit__(self, *exc: object) -> None:
        await (self.c.stop() if self.client == "aiokafka" else self.c.close())

    async def read(self, *, most: int | None = None, latency: bool = False) -> list[bytes]:
        most = most or self.batch
        if self.client == "aiokafka":
            got = await self.c.getmany(timeout_ms=500, max_records=most)
            return [r.value for recs in got.values() for r in recs]
        if latency:
            msg = await self.c.poll(0.5)
            msgs = [] if msg is None else [msg]
        else:
            msgs = await self.c.consume(num_messages=most, timeout=0.5)
        return [m.value() for m in msgs if m.error() is None]


def new_topic(admin: AdminClient, name: str) -> str:
    for f in admin.create_topics([NewTopic(name, 1, 1)]).values():
        f.result()
    return name


async def consume_rate(bus: BusConfig, client: str, topic: str, n: int) -> float:
    async with Reader(bus, client, topic, batch=5000) as r:
        first: list[bytes] = []
        while not first:  # connected and fetching: the clock starts at the first record in hand
            first = await r.read(most=1)
        t0 = time.perf_counter()
        seen = 1
        while seen < n:
            # Never more than are left: confluent's consume() waits out its timeout for a batch it
            # cannot fill, which would charge it the timeout and not the reading.
            for value in await r.read(most=n - seen):
                decode(value)
                seen += 1
        return (n - 1) / (time.perf_counter() - t0)


async def produce_rate(bus: BusConfig, client: str, topic: str, values: list[bytes]) -> float:
    if client == "confluent":
        with Producer(bus, client_id="bench") as p:
            t0 = time.perf_counter()
            for v in values:
                p.send_raw_nowait(v, topic)
            await p.aflush()
            return len(values) / (time.perf_counter() - t0)
    # NOTE: aiokafka's idempotent producer cannot start on the dev broker (its InitProducerId
    # request is answered UnknownError; ``idempotent_aiokafka_starts`` shows it): measured without.
    p = AIOKafkaProducer(**bus.aiokafka(acks="all", linger_ms=2, max_request_size=bus.max_message_bytes))
    await p.start()
    try:
        t0 = time.perf_counter()
        acks = [await p.send(topic, v) for v in values]
        await p.flush()
        await asyncio.gather(*acks)
        return len(values) / (time.perf_counter() - t0)
    finally:
        await p.stop()


async def idempotent_aiokafka_starts(bus: BusConfig) -> str:
    p = AIOKafkaProducer(**bus.aiokafka(enable_idempotence=True, acks="all"))
    try:
        await asyncio.wait_for(p.start(), 30)
        return "starts"
    except Exception as exc:
        return f"does not start: {type(exc).__name__}: {exc}"
    finally:
        await p.stop()


async def round_trip_ms(bus: BusConfig, client: str, req: str, rep: str, trips: int) -> float:
    producer = Producer(bus, client_id="bench")
    answers: dict[str, asyncio.Future[None]] = {}

    async def respond() -> None:
        async with Reader(bus, client, req, batch=100) as r:
            while True:
                for value in await r.read(latency=True):
                    await producer.send_raw(value, rep)

    async def collect() -> None:
        async with Reader(bus, client, rep, batch=100) as r:
            while True:
                for value in await r.read(latency=True):
                    fut = answers.pop(decode(value).event_id, None)
                    if fut is not None and not fut.done():
                        fut.set_result(None)

    tasks = [asyncio.create_task(respond()), asyncio.create_task(collect())]
    try:
        warm = action_chosen(tokens=20, seed=-1)  # both readers connected and fetching before the clock
        answers[warm.event_id] = asyncio.get_running_loop().create_future()
        await producer.send_raw(encode(warm), req)
        await asyncio.wait_for(answers[warm.event_id], 30)
        rtts = []
        for i in range(trips):
            event = action_chosen(tokens=20, seed=i)
            fut = answers[event.event_id] = asyncio.get_running_loop().create_future()
            t0 = time.perf_counter()
            await producer.send_raw(encode(event), req)
            await asyncio.wait_for(fut, 10)
            rtts.append((time.perf_counter() - t0) * 1000)
        return statistics.median(rtts)
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        producer.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=20000)
    ap.add_argument("--tokens", type=int, default=120, help="response tokens per action event")
    ap.add_argument("--trips", type=int, default=100, help="request-reply round trips per pass")
    ap.add_argument("--passes", type=int, default=passes.MIN_PASSES)
    args = ap.parse_args()

    with DevBroker() as broker:
        bus = BusConfig(bootstrap=broker.bootstrap, prefix="bench")
        admin = AdminClient(bus.librdkafka())
        log_topic = new_topic(admin, "bench.log")
        with Producer(bus, client_id="fill", linger_ms=5) as p:
            for i in range(args.events):
                p.send_raw_nowait(encode(action_chosen(tokens=args.tokens, seed=i)), log_topic)
        print(f"{args.events} action events on the log; {args.trips} round trips per pass; "
              f"{args.passes} passes per side, interleaved")

        rates = passes.interleave(
            {c: (lambda i, c=c: asyncio.run(consume_rate(bus, c, log_topic, args.events))) for c in CLIENTS},
            args.passes, on_pass=passes.pass_line("events/s"))
        print("consume + decode:")
        print(passes.report(rates, "events/s"))
        print(passes.ratio_line(rates, "confluent", "aiokafka"))

        print("aiokafka's idempotent producer on this broker:", asyncio.run(idempotent_aiokafka_starts(bus)))
        values = [encode(action_chosen(tokens=args.tokens, seed=i)) for i in range(args.events)]
        made = passes.interleave(
            {c: (lambda i, c=c: asyncio.run(produce_rate(bus, c, new_topic(admin, f"bench.p.{c}.{i}"), values)))
             for c in CLIENTS}, args.passes, on_pass=passes.pass_line("events/s"))
        print("produce (acks=all; confluent idempotent, aiokafka not):")
        print(passes.report(made, "events/s"))
        print(passes.ratio_line(made, "confluent", "aiokafka"))

        def trip(c: str, i: int) -> float:
            req, rep = new_topic(admin, f"bench.req.{c}.{i}"), new_topic(admin, f"bench.rep.{c}.{i}")
            return asyncio.run(round_trip_ms(bus, c, req, rep, args.trips))

        rtts = passes.interleave({c: (lambda i, c=c: trip(c, i)) for c in CLIENTS}, args.passes,
                                 on_pass=passes.pass_line("ms", ".2f"))
        print("reply round trip (median of each pass's trips):")
        print(passes.report(rtts, "ms", ".2f"))
        print(passes.ratio_line(rtts, "confluent", "aiokafka"))


if __name__ == "__main__":
    main()
