"""Scale simulator: dart's own overhead as env slots and rollout workers grow, through the real broker.

One command runs a sweep of points (env slots / env workers / rollout workers). Each point is a
fresh topic prefix on one dev broker (Tansu) and these processes:

- the **real data manager** (projection into chdb, scheduler, curation, batcher);
- **env workers** (the real :class:`EnvWorker`, synthetic backend with zero step latency),
  ``--env-procs`` processes holding the workers as asyncio tasks;
- **rollout workers**: members of one consumer group on the observations topic that answer
  every observation at once with a scripted action (the oracle's next action for half of the
  rollouts, a wrong ``finished`` for the other half, so groups are mixed and get batched);
- a **trainer stub** that reports every batch (TrainStepCompleted) and publishes a new policy
  version every ``--weights-every-s``.

So the only work is dart's: encode / produce / fetch / decode, reply routing, projection,
scheduling, curation, batching (plus the synthetic screen render, reported apart as env CPU).

Measured per point over a steady-state window (after every group joined and steps flow):
steps/s; step overhead p50/p99 (the env worker's request produced -> the action delivered to
its inbox: bus + rollout worker, the policy itself takes no time); consumer lag per group,
sampled every second (it must not grow); broker bytes per step (every record's key + value +
headers, every topic); CPU microseconds per step of each service and of the broker; reply read
amplification (records each env worker's inbox read / replies meant for it); scheduler decision
latency (one ``schedule_once`` pass).

    PYTHONPATH=$PWD .venv/bin/python benchmarks/scale.py            # sweep, table, PNG
    PYTHONPATH=$PWD .venv/bin/python benchmarks/scale.py --points 64x4x4 --routing hashed

Point syntax: SLOTSxENV_WORKERSxROLLOUT_WORKERS. ``--routing hashed`` is the design before
issue 18 (4 action partitions, inboxes by hash of the worker id), ``assigned`` (default) gives
every env worker its own reply partition.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import multiprocessing as mp
import statistics
import tempfile
import time
import uuid
import zlib
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, ClassVar

import psutil

RESULTS = Path(__file__).parent / "results"
ENV_GROUP = "env-workers-synthetic"
ROLLOUT_GROUP = "rollout"
TRAINER_GROUP = "trainer"
DATA_GROUP = "data-manager"


@dataclass(frozen=True, kw_only=True)
class Point:
    slots: int
    env_workers: int
    rollout_workers: int
    routing: str = "assigned"

    @property
    def label(self) -> str:
        return f"{self.slots}x{self.env_workers}x{self.rollout_workers}-{self.routing}"

    def partitions(self) -> dict[str, int]:
        """Partitions from config: every consumer-group member gets a partition to read."""
        out = {"rollout.requests": max(4, self.env_workers), "env.observations": max(4, self.rollout_workers)}
        if self.routing == "assigned":
            out["rollout.actions"] = max(4, self.env_workers)
        return out


def parse_point(text: str, routing: str) -> Point:
    slots, env, rollout = (int(x) for x in text.split("x"))
    return Point(slots=slots, env_workers=env, rollout_workers=rollout, routing=routing)


# --------------------------------------------------------------------------- child processes


class Window:
    """A child's counters at the start and the end of the measurement window."""

    def __init__(self, go: Any, stop: Any) -> None:
        self.go, self.stop = go, stop
        self.proc = psutil.Process()

    def cpu_s(self) -> float:
        t = self.proc.cpu_times()
        return t.user + t.system

    async def measure(self, counters: Any, on_start: Any = None) -> tuple[dict[str, float], dict[str, float], float]:
        """Wait for go, snapshot, wait for stop, snapshot: (start, end, cpu seconds in between)."""
        while not self.go.is_set():
            await asyncio.sleep(0.05)
        if on_start is not None:
            on_start()
        start, cpu0 = dict(counters()), self.cpu_s()
        while not self.stop.is_set():
            await asyncio.sleep(0.05)
        return start, dict(counters()), self.cpu_s() - cpu0


def failure(tasks: list[asyncio.Task[Any]]) -> str | None:
    """The first error among finished tasks (a child reports it instead of hiding it)."""
    for t in tasks:
        if t.done() and not t.cancelled() and t.exception() is not None:
            return f"{type(t.exception()).__name__}: {t.exception()}"
    return None


def _bus(bootstrap: str, prefix: str, point: Point) -> Any:
    from dart.bus import BusConfig

    return BusConfig(bootstrap=bootstrap, prefix=prefix, session_timeout_ms=3000, heartbeat_interval_ms=500,
                     partitions=point.partitions())


def run_env(bootstrap: str, prefix: str, point: Point, first: int, count: int, root: str, go: Any, stop: Any,
            out: str) -> None:
    asyncio.run(_env(bootstrap, prefix, point, first, count, Path(root), Window(go, stop), Path(out)))


async def _env(bootstrap: str, prefix: str, point: Point, first: int, count: int, root: Path, win: Window,
               out: Path) -> None:
    from dart.blobs import LocalBlobStore
    from dart.env.synthetic import SyntheticConfig
    from dart.env.worker import EnvWorker, EnvWorkerConfig

    bus = _bus(bootstrap, prefix, point)
    slots = point.slots // point.env_workers
    workers = [EnvWorker(EnvWorkerConfig(
        backend="synthetic", slots=slots, worker_id=f"env-{i}", run_id="scale", heartbeat_s=1.0,
        reply_partition=i if point.routing == "assigned" else None, requeue=False, synthetic=SyntheticConfig(seed=i),
    ), bus, LocalBlobStore(root / "blobs")) for i in range(first, first + count)]
    halt = asyncio.Event()
    runs = [asyncio.create_task(w.run(halt)) for w in workers]

    def counters() -> dict[str, float]:
        return {"steps": sum(w.counts["steps"] for w in workers),
                "read": sum(w.inbox.read for w in workers),
                "ignored": sum(w.inbox.ignored for w in workers)}

    def clear() -> None:
        for w in workers:
            w.inbox.waits_s.clear()

    start, end, cpu = await win.measure(counters, on_start=clear)
    waits = [s for w in workers for s in w.inbox.waits_s]
    failed = failure(runs)
    halt.set()
    await asyncio.wait(runs, timeout=10)
    out.write_text(json.dumps({"error": failed, "steps": end["steps"] - start["steps"], "read": end["read"] - start["read"],
                               "ignored": end["ignored"] - start["ignored"], "cpu_s": cpu, "waits_s": waits}))


def run_rollout(bootstrap: str, prefix: str, point: Point, first: int, count: int, tasks: list[dict], go: Any,
                stop: Any, out: str) -> None:
    asyncio.run(_rollout(bootstrap, prefix, point, first, count, tasks, Window(go, stop), Path(out)))


async def _rollout(bootstrap: str, prefix: str, point: Point, first: int, count: int, tasks: list[dict],
                   win: Window, out: Path) -> None:
    from dart.agent.actions import Finished, to_wire
    from dart.bus import Consumer, Producer
    from dart.env.synthetic import oracle_plan
    from dart.events import ActionChosen

    bus = _bus(bootstrap, prefix, point)
    plans = {t["id"]: oracle_plan(t) for t in tasks}
    producer = Producer(bus, client_id=f"rollout-{first}")
    answered = [0]

    async def answer(d: Any) -> None:
        obs = d.event
        plan = plans[obs.task_id]
        good = zlib.crc32(obs.rollout_id.encode()) % 2 == 0
        action = plan[obs.step_index] if good and obs.step_index < len(plan) else Finished()
        await producer.reply(obs.reply, ActionChosen.new(
            run_id="scale", producer="rollout", in_reply_to=obs.event_id, rollout_id=obs.rollout_id,
            request_id=obs.request_id, task_id=obs.task_id, step_index=obs.step_index, response_text=repr(action),
            actions=[to_wire(action)], response_token_ids=[1, 2, 3, 4], logprobs=[-0.1] * 4, entropies=[0.5] * 4,
            policy_version=0, prompt_hash="", prompt_tokens=0, finish_reason="stop", engine="scripted",
            queue_s=0.0, generate_s=0.0, sampling=obs.sampling))
        answered[0] += 1

    consumers = [Consumer(bus, topics=[bus.topics.observations], group=ROLLOUT_GROUP, handler=answer,
                          producer=producer, client_id=f"rollout-{i}", concurrent_partitions=True)
                 for i in range(first, first + count)]
    runs = [asyncio.create_task(c.run()) for c in consumers]
    await asyncio.gather(*(c.started.wait() for c in consumers))
    out.with_suffix(".ready").touch()
    start, end, cpu = await win.measure(lambda: {"answered": answered[0]})
    for c in consumers:
        c.stop()
    await asyncio.wait(runs, timeout=10)
    producer.close()
    out.write_text(json.dumps({"answered": end["answered"] - start["answered"], "cpu_s": cpu}))


def run_data(bootstrap: str, prefix: str, point: Point, root: str, go: Any, stop: Any, out: str) -> None:
    logging.basicConfig(filename=Path(root) / "data.log", level=logging.INFO)
    asyncio.run(_data(bootstrap, prefix, point, Path(root), Window(go, stop), Path(out)))


async def _data(bootstrap: str, prefix: str, point: Point, root: Path, win: Window, out: Path) -> None:
    from dart.blobs import LocalBlobStore
    from dart.data.config import (
        BatcherConfig,
        CurationConfig,
        DataConfig,
        HttpConfig,
        SchedulerConfig,
        StoreConfig,
    )
    from dart.data.manager import DataManager
    from dart.data.store import Store

    bus = _bus(bootstrap, prefix, point)
    cfg = DataConfig(run_id="scale", blobs=str(root / "blobs"), store=StoreConfig(dsn=f"chdb://{root / 'chdb'}"),
                     http=HttpConfig(enabled=False), scheduler=SchedulerConfig(interval_s=0.5),
                     batcher=BatcherConfig(interval_s=1.0),
                     curation=CurationConfig(min_failed_steps=0, inject_experience=False, max_steps=8))
    manager = DataManager(cfg, bus, store=Store.open(cfg.store), blobs=LocalBlobStore(cfg.blobs), seed=0)
    decisions: list[float] = []
    schedule_once = manager.schedule_once

    async def timed(at_ms: int | None = None) -> Any:
        t0 = time.perf_counter()
        plan = await schedule_once(at_ms)
        decisions.append(time.perf_counter() - t0)
        return plan

    manager.schedule_once = timed  # type: ignore[method-assign]
    run = asyncio.create_task(manager.run())
    await manager.consumer.started.wait()
    out.with_suffix(".ready").touch()
    start, end, cpu = await win.measure(lambda: {"projected": manager.projected, "batches": manager.batches_emitted,
                                                 "decisions": len(decisions)})
    failed = failure([run])
    manager.stop()
    await asyncio.wait([run], timeout=20)
    out.write_text(json.dumps({"projected": end["projected"] - start["projected"], "cpu_s": cpu, "error": failed,
                               "batches": end["batches"] - start["batches"],
                               "decision_s": decisions[int(start["decisions"]):int(end["decisions"])]}))


def run_trainer(bootstrap: str, prefix: str, point: Point, every_s: float, go: Any, stop: Any, out: str) -> None:
    asyncio.run(_trainer(bootstrap, prefix, point, every_s, Window(go, stop), Path(out)))


async def _trainer(bootstrap: str, prefix: str, point: Point, every_s: float, win: Window, out: Path) -> None:
    from dart.bus import Consumer, Producer
    from dart.events import TrainStepCompleted, WeightsPublished

    bus = _bus(bootstrap, prefix, point)
    producer = Producer(bus, client_id="trainer")
    state = {"batches": 0, "version": 0, "last": ""}

    async def on_batch(d: Any) -> None:
        state["batches"] += 1
        state["last"] = d.event.batch_id
        await producer.send(TrainStepCompleted.new(
            run_id="scale", producer="trainer", step=state["batches"], policy_version=state["version"],
            batch_id=d.event.batch_id, loss=0.0, kl=0.0, entropy=0.0, clip_frac=0.0, tis_mean=1.0,
            logprob_mismatch=0.0, grad_norm=0.0, num_samples=0, num_tokens=0, duration_s=0.0, tokens_per_s=0.0))

    async def publish() -> None:
        while True:
            await asyncio.sleep(every_s)
            if state["last"]:
                state["version"] += 1
                await producer.send(WeightsPublished.new(
                    run_id="scale", producer="trainer", version=state["version"], parent_version=state["version"] - 1,
                    blobs=[], sha256="0" * 64, train_step=state["batches"], batch_id=state["last"]))

    consumer = Consumer(bus, topics=[bus.topics.batches], group=TRAINER_GROUP, handler=on_batch, producer=producer)
    runs = [asyncio.create_task(consumer.run()), asyncio.create_task(publish())]
    start, end, cpu = await win.measure(lambda: dict(state))
    consumer.stop()
    runs[1].cancel()
    await asyncio.wait(runs, timeout=10)
    producer.close()
    out.write_text(json.dumps({"batches": end["batches"] - start["batches"], "cpu_s": cpu,
                               "versions": end["version"] - start["version"]}))


# --------------------------------------------------------------------------- the point's driver


class Tail:
    """Follows every topic of the prefix without a group: broker bytes, high watermarks, and
    the committed offsets of each group, so lag = high watermark - committed, per group."""

    GROUPS: ClassVar[dict[str, str | None]] = {DATA_GROUP: None, ENV_GROUP: "rollout.requests", ROLLOUT_GROUP: "env.observations",
              TRAINER_GROUP: "train.batches"}

    def __init__(self, bus: Any) -> None:
        self.bus = bus
        self.bytes = 0
        self.records = 0
        self.lag: dict[str, list[tuple[float, int]]] = {g: [] for g in self.GROUPS}

    async def run(self, stop: asyncio.Event) -> None:
        from aiokafka import AIOKafkaConsumer, TopicPartition

        from dart.log.archiver import committed_offsets

        consumer = AIOKafkaConsumer(bootstrap_servers=self.bus.bootstrap, enable_auto_commit=False,
                                    fetch_max_wait_ms=100, max_partition_fetch_bytes=self.bus.max_message_bytes)
        await consumer.start()
        await consumer.topics()  # fills the metadata cache
        tps = [TopicPartition(t, p) for t in self.bus.topics.all() for p in consumer.partitions_for_topic(t) or ()]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        t0, next_lag = time.monotonic(), 0.0
        try:
            while not stop.is_set():
                for records in (await consumer.getmany(timeout_ms=200, max_records=5000)).values():
                    for rec in records:
                        self.bytes += len(rec.value or b"") + len(rec.key or b"") + sum(
                            len(k) + len(v or b"") for k, v in rec.headers or ())
                    self.records += len(records)
                if time.monotonic() >= next_lag:
                    next_lag = time.monotonic() + 1.0
                    committed = await asyncio.get_running_loop().run_in_executor(None, committed_offsets, self.bus)
                    for group, suffix in self.GROUPS.items():
                        topics = self.bus.topics.all() if suffix is None else [self.bus.topics.name(suffix)]
                        lag = 0
                        for tp in tps:
                            hw = consumer.highwater(tp)
                            if tp.topic in topics and hw is not None:
                                lag += hw - committed.get(self.bus.group_id(group), {}).get(tp.topic, {}).get(str(tp.partition), 0)
                        self.lag[group].append((round(time.monotonic() - t0, 1), lag))
        finally:
            await consumer.stop()


async def ready(paths: list[Path], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not all(p.exists() for p in paths):
        if time.monotonic() > deadline:
            raise TimeoutError(f"not ready after {timeout_s} s: {[p.name for p in paths if not p.exists()]}")
        await asyncio.sleep(0.1)


def spawn(target: Any, *args: Any) -> Any:
    proc = mp.get_context("spawn").Process(target=target, args=args, daemon=True)
    proc.start()
    return proc


def split(n: int, parts: int) -> list[tuple[int, int]]:
    """(first, count) of ``parts`` near-equal shares of ``n``."""
    parts = max(1, min(parts, n))
    out, first = [], 0
    for i in range(parts):
        count = n // parts + (i < n % parts)
        out.append((first, count))
        first += count
    return out


async def run_point(point: Point, bootstrap: str, broker_pid: int, args: argparse.Namespace,
                    root: Path) -> dict[str, Any]:
    from dart.bus import ensure_topics
    from dart.env.synthetic import generate_tasks
    from dart.stack.up import register_tasks

    prefix = f"scale{uuid.uuid4().hex[:6]}"
    bus = _bus(bootstrap, prefix, point)
    ensure_topics(bus)
    tasks = generate_tasks(args.tasks, preset="tiny", seed=0)
    register_tasks(bus, "scale", tasks, "train")
    work = root / point.label
    work.mkdir(parents=True)
    ctx = mp.get_context("spawn")
    go, stop = ctx.Event(), ctx.Event()
    outs: dict[str, Path] = {}
    procs = []

    def out(name: str) -> str:
        outs[name] = work / f"{name}.json"
        return str(outs[name])

    # One group at a time: the data manager, then the rollout workers, then the env workers
    # (on Tansu, groups that rebalance at once can starve each other's joins for a long time).
    procs.append(spawn(run_data, bootstrap, prefix, point, str(work), go, stop, out("data")))
    procs.append(spawn(run_trainer, bootstrap, prefix, point, args.weights_every_s, go, stop, out("trainer")))
    await ready([work / "data.ready"], args.join_timeout_s)
    rollouts = split(point.rollout_workers, args.rollout_procs)
    for k, (first, count) in enumerate(rollouts):
        procs.append(spawn(run_rollout, bootstrap, prefix, point, first, count, tasks, go, stop, out(f"rollout{k}")))
    await ready([work / f"rollout{k}.ready" for k in range(len(rollouts))], args.join_timeout_s)
    for k, (first, count) in enumerate(split(point.env_workers, args.env_procs)):
        procs.append(spawn(run_env, bootstrap, prefix, point, first, count, str(work), go, stop, out(f"env{k}")))

    halt = asyncio.Event()
    tail = Tail(bus)
    tail_run = asyncio.create_task(tail.run(halt))
    broker = psutil.Process(broker_pid)
    await asyncio.sleep(args.warmup_s)
    cpu0 = sum(broker.cpu_times()[:2])
    bytes0 = tail.bytes
    lag_from = {g: len(v) for g, v in tail.lag.items()}
    go.set()
    t0 = time.monotonic()
    await asyncio.sleep(args.window_s)
    stop.set()
    wall = time.monotonic() - t0
    broker_cpu = sum(broker.cpu_times()[:2]) - cpu0
    await asyncio.sleep(1.0)
    bytes_in_window = tail.bytes - bytes0
    for p in procs:
        p.join(timeout=40)
        if p.is_alive():
            p.terminate()
    halt.set()
    await tail_run
    parts = {name: json.loads(path.read_text()) for name, path in outs.items() if path.exists()}
    missing = sorted(set(outs) - set(parts))
    errors = {name: part["error"] for name, part in parts.items() if part.get("error")}
    return summarise(point, parts, missing=missing, errors=errors, wall_s=wall, broker_cpu_s=broker_cpu,
                     bytes_in_window=bytes_in_window,
                     lag={g: v[lag_from[g]:] for g, v in tail.lag.items()})


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def summarise(point: Point, parts: dict[str, Any], *, missing: list[str], errors: dict[str, str], wall_s: float, broker_cpu_s: float,
              bytes_in_window: int, lag: dict[str, list[tuple[float, int]]]) -> dict[str, Any]:
    env = [v for k, v in parts.items() if k.startswith("env")]
    rollout = [v for k, v in parts.items() if k.startswith("rollout")]
    steps = sum(e["steps"] for e in env)
    waits = [w for e in env for w in e["waits_s"]]
    read = sum(e["read"] for e in env)
    mine = read - sum(e["ignored"] for e in env)
    per_step = max(steps, 1)
    data, trainer = parts.get("data", {}), parts.get("trainer", {})
    decisions = data.get("decision_s", [])

    def growth(series: list[tuple[float, int]]) -> float:
        """Lag at the end of the window minus lag at its start (averaged over 3 samples each)."""
        if len(series) < 6:
            return float("nan")
        return statistics.mean(v for _, v in series[-3:]) - statistics.mean(v for _, v in series[:3])

    return {
        **asdict(point), "label": point.label, "missing": missing, "errors": errors, "window_s": round(wall_s, 1),
        "steps": steps, "steps_per_s": round(steps / wall_s, 1),
        "overhead_ms_p50": round(pct(waits, 0.50) * 1e3, 2), "overhead_ms_p99": round(pct(waits, 0.99) * 1e3, 2),
        "read_amplification": round(read / mine, 2) if mine else None,
        "broker_bytes_per_step": round(bytes_in_window / per_step),
        "cpu_us_per_step": {
            "env": round(sum(e["cpu_s"] for e in env) / per_step * 1e6),
            "rollout": round(sum(r["cpu_s"] for r in rollout) / per_step * 1e6),
            "data": round(data.get("cpu_s", 0.0) / per_step * 1e6),
            "trainer": round(trainer.get("cpu_s", 0.0) / per_step * 1e6),
            "broker": round(broker_cpu_s / per_step * 1e6),
        },
        "data_us_per_event": round(data.get("cpu_s", 0.0) / max(data.get("projected", 0), 1) * 1e6),
        "events_projected_per_s": round(data.get("projected", 0) / wall_s, 1),
        "batches": data.get("batches", 0), "weight_versions": trainer.get("versions", 0),
        "decision_ms_p50": round(pct(decisions, 0.5) * 1e3, 1), "decision_ms_p99": round(pct(decisions, 0.99) * 1e3, 1),
        "lag": lag, "lag_growth": {g: growth(v) for g, v in lag.items()},
        "lag_max": {g: max((v for _, v in s), default=0) for g, s in lag.items()},
    }


# --------------------------------------------------------------------------- report


def table(results: list[dict[str, Any]]) -> str:
    head = ("| slots / env workers / rollout workers | routing | steps/s | overhead p50 / p99 ms | read amp. | "
            "bytes/step | CPU µs/step env / rollout / data / trainer / broker | data µs/event | "
            "max lag (data / env / rollout / trainer) | lag growth | decision p50 / p99 ms |")
    rows = [head, "|" + "---|" * 11]
    for r in results:
        c, lag = r["cpu_us_per_step"], r["lag_max"]
        growth = max((v for v in r["lag_growth"].values() if v == v), default=float("nan"))
        rows.append(
            f"| {r['slots']} / {r['env_workers']} / {r['rollout_workers']} | {r['routing']} | {r['steps_per_s']} | "
            f"{r['overhead_ms_p50']} / {r['overhead_ms_p99']} | {r['read_amplification']} | "
            f"{r['broker_bytes_per_step']} | {c['env']} / {c['rollout']} / {c['data']} / {c['trainer']} / "
            f"{c['broker']} | {r['data_us_per_event']} | {lag[DATA_GROUP]} / {lag[ENV_GROUP]} / "
            f"{lag[ROLLOUT_GROUP]} / {lag[TRAINER_GROUP]} | {growth:+.0f} | "
            f"{r['decision_ms_p50']} / {r['decision_ms_p99']} |")
    return "\n".join(rows)


def plot(results: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    for routing, style in (("assigned", "o-"), ("hashed", "s--")):
        rs = sorted((r for r in results if r["routing"] == routing), key=lambda r: r["slots"])
        if not rs:
            continue
        xs = [r["slots"] for r in rs]
        axes[0].plot(xs, [sum(r["cpu_us_per_step"].values()) for r in rs], style, label=f"all, {routing}")
        if routing == "assigned":
            for svc in ("env", "rollout", "data", "broker"):
                axes[0].plot(xs, [r["cpu_us_per_step"][svc] for r in rs], ":", marker=".", label=svc)
        axes[1].plot(xs, [r["overhead_ms_p99"] for r in rs], style, label=f"p99, {routing}")
        axes[1].plot(xs, [r["overhead_ms_p50"] for r in rs], style, alpha=0.5, label=f"p50, {routing}")
        axes[2].plot(xs, [r["read_amplification"] or 0 for r in rs], style, label=routing)
    axes[0].set(title="CPU per env step (all processes)", xlabel="env slots", ylabel="µs / step", xscale="log",
                yscale="log")
    axes[1].set(title="step overhead (request -> action delivered)", xlabel="env slots", ylabel="ms", xscale="log")
    axes[2].set(title="reply read amplification", xlabel="env slots", ylabel="records read / own reply",
                xscale="log")
    ticks = sorted({r["slots"] for r in results})
    for ax in axes:
        ax.set_xticks(ticks, [str(t) for t in ticks])
        ax.minorticks_off()
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle("dart's own overhead vs scale (busy 2-core machine; rollout workers grow with slots)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--points", default="64x4x4,250x10x25,1000x25x100",
                   help="comma-separated SLOTSxENV_WORKERSxROLLOUT_WORKERS")
    p.add_argument("--routing", default="assigned,hashed", help="reply routing(s) to run at every point")
    p.add_argument("--env-procs", type=int, default=2, help="processes that hold the env workers")
    p.add_argument("--rollout-procs", type=int, default=1, help="processes that hold the rollout workers")
    p.add_argument("--tasks", type=int, default=200)
    p.add_argument("--weights-every-s", type=float, default=5.0, help="trainer stub's publish cadence")
    p.add_argument("--warmup-s", type=float, default=15.0, help="after the env workers start")
    p.add_argument("--join-timeout-s", type=float, default=90.0)
    p.add_argument("--window-s", type=float, default=30.0)
    p.add_argument("--json", type=Path, default=RESULTS / "scale.json")
    p.add_argument("--png", type=Path, default=RESULTS / "scale.png")
    p.add_argument("--plot-only", action="store_true", help="redraw the PNG and table from --json")
    args = p.parse_args()
    if args.plot_only:
        results = json.loads(args.json.read_text())["results"]
        plot(results, args.png)
        print(table(results))
        return

    from dart.bus import DevBroker

    points = [parse_point(t, routing) for t in args.points.split(",") for routing in args.routing.split(",")]
    results = []
    with tempfile.TemporaryDirectory() as tmp, DevBroker(log_path=Path(tmp) / "tansu.log") as broker:
        tansu = next(c for c in psutil.Process().children(recursive=True) if "tansu" in c.name())
        for point in points:
            load = psutil.getloadavg()[0]
            r = asyncio.run(run_point(point, broker.bootstrap, tansu.pid, args, Path(tmp)))
            r["load_avg_1m_before"] = round(load, 1)
            results.append(r)
            print(json.dumps({k: v for k, v in r.items() if k != "lag"}), flush=True)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"cpus": psutil.cpu_count(), "args": {k: str(v) for k, v in vars(args).items()},
                                     "results": results}, indent=1))
    plot(results, args.png)
    print(table(results))
    print(f"\nwrote {args.json} and {args.png}")


if __name__ == "__main__":
    main()
