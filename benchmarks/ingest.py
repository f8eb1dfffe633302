"""Data manager ingest and curation-query latency.

1. Projection throughput: a mixed log (per step an ObservationEmitted + an ActionChosen, per
   trajectory a TrajectoryFinished + a RewardAssigned, plus the requests) is produced to a
   dev broker; the data manager's consumer projects it into chdb (decode, row mapping,
   batched inserts, commits after each insert). Events/s from the first projected fetch to
   the last, against a raw clickhouse-connect insert of the very same rows in the same run
   (one insert per table, no broker, no decode): the ratio is the price of the log.
2. Curation queries at scale: a projection of ``--steps`` steps (default 1M; 20 steps per
   trajectory, groups of 8, 300 tasks, 100 policy versions, 90 % of groups already batched)
   is generated inside ClickHouse, then each query the scheduler and the batcher run every
   pass is timed (median of 5).

    .venv/bin/python benchmarks/ingest.py [--events 60000] [--steps 1000000] [--passes 5]

Part 1's sides (consumer with ClickHouse decoding, the Python path, the raw insert) run
``--passes`` times each, interleaved pass by pass: medians, spread, ratio of medians.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import passes  # benchmarks/passes.py: interleaved passes, medians, ratio of medians

from dart.blobs import LocalBlobStore
from dart.bus import BusConfig, DevBroker, Producer, ensure_topics
from dart.data import avroload, projection
from dart.data.config import BatcherConfig, DataConfig, HttpConfig, ProjectionConfig, SchedulerConfig
from dart.data.manager import DataManager
from dart.data.replay import compare, format_checks
from dart.data.rows import TABLES, group_rows
from dart.data.rule_inputs import LATE_MS, Horizon, SlowStats, batch_inputs, schedule_inputs
from dart.data.store import Store
from dart.events import (
    ActionChosen,
    Event,
    HistoryTurn,
    ObservationEmitted,
    ParsedAction,
    ReplyRoute,
    RewardAssigned,
    RolloutRequested,
    Sampling,
    TrajectoryFinished,
    TrajectoryStatus,
    decode,
    encode,
)

STEPS_PER_S = 333
"""The generated run's pace (curation queries at scale)."""
SAMPLING = Sampling(temperature=0.7, top_p=0.9, max_new_tokens=500, seed=1)
ROUTE = ReplyRoute(topic="replies", partition=0, worker_id="env-0")


def log_of(n_events: int, *, steps: int = 10, tokens: int = 60) -> list[Event]:
    """A realistic mix: per trajectory 1 request + `steps` x (observation + action) + finish + reward."""
    env = {"run_id": "bench", "producer": "bench"}
    out: list[Event] = []
    r = 0
    while len(out) < n_events:
        rid, req, task, gid = str(uuid.uuid4()), str(uuid.uuid4()), f"task-{r % 50}", f"g-{r // 8}"
        out.append(RolloutRequested.new(**env, request_id=req, task_id=task, group_id=gid, rollout_index=r % 8,
                                        group_size=8, max_steps=30, sampling=SAMPLING))
        history: list[HistoryTurn] = []
        for s in range(steps):
            obs = ObservationEmitted.new(**env, rollout_id=rid, request_id=req, task_id=task, group_id=gid,
                                         step_index=s, instruction="Open the spreadsheet and sum column B",
                                         screenshot_digest=uuid.uuid4().hex * 2, screen_width=1920,
                                         screen_height=1080, history=history[-5:], reply=ROUTE, sampling=SAMPLING,
                                         max_steps=30, env_worker="env-0", slot=s % 4)
            text = "Thought: the cell is visible.\nAction: click(start_box='(512,300)')"
            act = ActionChosen.new(**env, in_reply_to=obs.event_id, rollout_id=rid, request_id=req, task_id=task,
                                   step_index=s, response_text=text, actions=[ParsedAction(kind="click", x=512, y=300)],
                                   response_token_ids=list(range(tokens)), logprobs=[-0.25] * tokens,
                                   entropies=[0.5] * tokens, policy_version=r // 100, prompt_hash="ab" * 32,
                                   prompt_tokens=1500, finish_reason="stop", engine="bench", queue_s=0.001,
                                   generate_s=0.2, sampling=SAMPLING)
            out += [obs, act]
            history.append(HistoryTurn(step_index=s, screenshot_digest=obs.screenshot_digest, response_text=text))
        ok = r % 3 == 0
        out.append(TrajectoryFinished.new(**env, rollout_id=rid, request_id=req, task_id=task, group_id=gid,
                                          rollout_index=r % 8, status=TrajectoryStatus.SUCCESS if ok else
                                          TrajectoryStatus.FAIL, finish_reason="done", num_steps=steps, max_steps=30,
                                          step_policy_versions=[r // 100] * steps, env_worker="env-0", slot=0,
                                          reset_s=1.0, env_s=5.0, policy_wait_s=2.0, eval_s=0.5, started_at=0))
        out.append(RewardAssigned.new(**env, rollout_id=rid, task_id=task, group_id=gid, reward=1.0 if ok else 0.0,
                                      evaluator="bench", evaluator_version="1"))
        r += 1
    return out


def produce(bus: BusConfig, events: list[Event]) -> None:
    with Producer(bus) as p:
        for e in events:
            p.send_nowait(e)
        p.flush(120)


@dataclass
class ConsumerRun:
    rate: float
    """events/s from the first fetch handed to the projection to the last projected"""
    inserts: int
    by_clickhouse: int
    """events ClickHouse decoded (the rest went through Python)"""
    wall_s: float
    handler_s: float
    """wall time inside the projection handler (container + insert, or decode + map + insert)"""
    cpu_s: float
    """CPU time of this process (consumer, projection, chdb threads; not the broker's)"""


async def consumer_rate(bus: BusConfig, store: Store, events: list[Event], tmp: Path, *,
                        clickhouse_decode: bool) -> ConsumerRun:
    """One data manager (a fresh consumer group) projecting the whole log."""
    cfg = DataConfig(http=HttpConfig(enabled=False), scheduler=SchedulerConfig(enabled=False),
                     batcher=BatcherConfig(enabled=False),
                     projection=ProjectionConfig(group=f"bench-{uuid.uuid4().hex[:6]}",
                                                 clickhouse_decode=clickhouse_decode))
    dm = DataManager(cfg, bus, store=store, blobs=LocalBlobStore(tmp / "blobs"))
    first: list[float] = []
    inserts = 0
    handler_s = 0.0
    project = dm.project

    async def timed(batch):  # type: ignore[no-untyped-def]
        nonlocal inserts, handler_s
        if not first:
            first.append(time.perf_counter())
            first.append(time.process_time())
        inserts += 1
        t0 = time.perf_counter()
        try:
            return await project(batch)
        finally:
            handler_s += time.perf_counter() - t0

    dm.consumer.raw_batch_handler = timed
    run = asyncio.create_task(dm.run())
    while dm.projected < len(events):
        await asyncio.sleep(0.02)
        if run.done():
            run.result()
    elapsed = time.perf_counter() - first[0]
    cpu = time.process_time() - first[1]
    dm.stop()
    await run
    return ConsumerRun(len(events) / elapsed, inserts, dm.projected_by_clickhouse, elapsed, handler_s, cpu)


def cpu_rates(events: list[Event]) -> tuple[float, float]:
    """Where the consumer's time goes: Avro decode alone, event -> row mapping alone (events/s)."""
    blobs = [encode(e) for e in events]
    t0 = time.perf_counter()
    decoded = [decode(b) for b in blobs]
    t1 = time.perf_counter()
    group_rows(decoded)
    t2 = time.perf_counter()
    return len(events) / (t1 - t0), len(events) / (t2 - t1)


def sql_rate(store: Store, events: list[Event], batch: int = 5000) -> float:
    """The ClickHouse path alone (container files + INSERT … SELECT), no broker: fetch-sized
    batches of one event type each, as a partition fetch of one topic gives them."""
    by_type: dict[type, list[SimpleNamespace]] = {}
    for e in events:
        by_type.setdefault(type(e), []).append(SimpleNamespace(value=encode(e)))
    t0 = time.perf_counter()
    for records in by_type.values():
        for i in range(0, len(records), batch):
            avroload.project_records(store, records[i:i + batch], projection.write_events)
    return len(events) / (time.perf_counter() - t0)


def raw_rate(store: Store, events: list[Event]) -> float:
    tables = group_rows(events)                  # rows built before the clock starts
    t0 = time.perf_counter()
    for table, rows in tables.items():
        store.insert_rows(table, rows)
    return len(events) / (time.perf_counter() - t0)


def generate(store: Store, steps: int) -> None:
    """A projection of `steps` steps, generated inside ClickHouse (20 steps/trajectory).

    Times are a run that ended now at ``STEPS_PER_S`` steps/s (1,000 environments at ~3 s a
    step: 10M steps are ~9 hours); policy versions advance every 500 trajectories.
    """
    db, n_traj = store.database, steps // 20
    c = store.command
    end_ms = int(time.time() * 1000)

    def at(step: str) -> str:  # the time of the step numbered by the SQL expression `step`
        return f"fromUnixTimestamp64Milli(toInt64({end_ms} - ({steps} - ({step})) * 1000 / {STEPS_PER_S}))"
    c(f"""INSERT INTO {db}.actions (event_id, event_time, rollout_id, request_id, task_id, step_index, in_reply_to,
        response_token_ids, logprobs, entropies, num_tokens, mean_entropy, policy_version, prompt_hash)
        SELECT concat('a', toString(number)), {at('number')}, concat('r', toString(intDiv(number, 20))),
        concat('q', toString(intDiv(number, 20))), concat('task', toString(intDiv(number, 20) % 300)), number % 20,
        concat('o', toString(number)), arrayMap(i -> toInt32(i), range(40)), arrayMap(i -> -0.3, range(40)),
        arrayMap(i -> (number % 7) / 7, range(40)), 40, (number % 7) / 7, intDiv(intDiv(number, 20), 500), 'h'
        FROM numbers({steps})""")
    c(f"""INSERT INTO {db}.observations (event_id, event_time, rollout_id, request_id, task_id, group_id, step_index,
        instruction, screenshot_digest, screen_width, screen_height, history_step_index, history_screenshot_digest,
        history_response_text)
        SELECT concat('o', toString(number)), {at('number')}, concat('r', toString(intDiv(number, 20))),
        concat('q', toString(intDiv(number, 20))), concat('task', toString(intDiv(number, 20) % 300)),
        concat('g', toString(intDiv(intDiv(number, 20), 8))), number % 20, 'Sum column B',
        hex(sipHash128(number)), 1920, 1080, arrayMap(i -> toInt32(i), range(greatest(0, toInt64(number % 20) - 5),
        number % 20)), arrayMap(i -> 'digest', range(least(5, number % 20))),
        arrayMap(i -> 'Action: click(start_box=''(1,2)'')', range(least(5, number % 20)))
        FROM numbers({steps})""")
    c(f"""INSERT INTO {db}.requests (event_id, event_time, request_id, task_id, group_id, rollout_index, group_size,
        max_steps, mode)
        SELECT concat('e', toString(number)), {at('number * 20')}, concat('q', toString(number)),
        concat('task', toString(number % 300)), concat('g', toString(intDiv(number, 8))), number % 8, 8, 30, 'train'
        FROM numbers({n_traj})""")
    c(f"""INSERT INTO {db}.trajectories (event_id, event_time, rollout_id, request_id, task_id, group_id,
        rollout_index, status, num_steps, max_steps, step_policy_versions, min_policy_version, max_policy_version,
        mode, origin)
        SELECT concat('f', toString(number)), {at('number * 20 + 19')}, concat('r', toString(number)),
        concat('q', toString(number)), concat('task', toString(number % 300)), concat('g', toString(intDiv(number, 8))),
        number % 8, if(number % 3 = 0, 'success', 'fail'), 20, 30, arrayMap(i -> intDiv(number, 500), range(20)),
        intDiv(number, 500), intDiv(number, 500), 'train', 'online'
        FROM numbers({n_traj})""")
    c(f"""INSERT INTO {db}.rewards (event_id, event_time, rollout_id, task_id, group_id, reward)
        SELECT concat('w', toString(number)), {at('number * 20 + 19')}, concat('r', toString(number)),
        concat('task', toString(number % 300)), concat('g', toString(intDiv(number, 8))), if(number % 3 = 0, 1.0, 0.0)
        FROM numbers({n_traj})""")
    used = int(n_traj * 0.9) // 48
    c(f"""INSERT INTO {db}.batches (event_id, event_time, batch_id, seq, rollout_ids, trainer_version)
        SELECT concat('b', toString(number)), {at('number * 48 * 20 + 48 * 20')}, concat('batch', toString(number)), number,
        arrayMap(i -> concat('r', toString(number * 48 + i)), range(48)), intDiv(number * 48, 500)
        FROM numbers({used})""")
    c(f"""INSERT INTO {db}.weights (event_id, event_time, version) SELECT concat('v', toString(number)), {at('number * 500 * 20')},
        number FROM numbers({n_traj // 500})""")


def timed(fn, repeat: int = 5) -> float:  # type: ignore[no-untyped-def]
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1000


def query_latencies(store: Store, steps: int) -> list[tuple[str, float]]:
    """Each query a scheduler or batcher pass runs: the first pass after a start reads the whole
    run; later passes read from the horizon the first one left (``rule_inputs.Horizon``)."""
    cfg = DataConfig()
    now = int(time.time() * 1000)
    batch = [f"r{i}" for i in range(48)]
    oldest = projection.current_version(store) - cfg.curation.window_versions
    first, _ = schedule_inputs(store, cfg, now_ms=now, pending_requests=set())
    since = first.open_since_ms

    def steady_pass() -> None:
        horizon = Horizon(open_since_ms=since, lengths_read_ms=now)
        schedule_inputs(store, cfg, now_ms=now, pending_requests=set(), horizon=horizon)

    # most passes: success rates, lengths and the pool kept from a pass less than stats_every_s ago
    kept_stats = SlowStats(every_ms=10**12)
    schedule_inputs(store, cfg, now_ms=now, pending_requests=set(), horizon=Horizon(open_since_ms=since),
                    slow=kept_stats)
    batch_inputs(store, cfg, since_ms=since, now_ms=now, slow=kept_stats)

    def kept_stats_pass() -> None:
        horizon = Horizon(open_since_ms=since, lengths_read_ms=now)
        schedule_inputs(store, cfg, now_ms=now, pending_requests=set(), horizon=horizon, slow=kept_stats)

    # what a data manager saves every 30 s, and what the next one starts from
    kept = Horizon(open_since_ms=since)
    schedule_inputs(store, cfg, now_ms=now, pending_requests=set(), horizon=kept)
    kept.save(store, now_ms=now)

    def restarted_pass() -> None:
        restored = Horizon.load(store)
        assert restored is not None
        schedule_inputs(store, cfg, now_ms=now, pending_requests=set(), horizon=restored)

    return [
        ("success-rate window (recent_outcomes)", timed(lambda: projection.recent_outcomes(
            store, mode="train", oldest_version=oldest, window=32))),
        ("success lengths, whole run (first pass)", timed(lambda: projection.success_lengths(store, threshold=0.5))),
        ("success lengths, new rows (later passes)", timed(lambda: projection.success_lengths(
            store, threshold=0.5, since_ms=now - LATE_MS))),
        ("experience pool", timed(lambda: projection.experience_pool(store, threshold=0.5))),
        ("open groups, whole run (first pass)", timed(lambda: projection.open_groups(store, mode="train"))),
        ("open groups, from the horizon", timed(lambda: projection.open_groups(store, mode="train", since_ms=since))),
        ("in flight", timed(lambda: projection.in_flight(store, mode="train", since_ms=max(since, now - 1_800_000)))),
        ("used rollouts, whole run", timed(lambda: projection.used_rollouts(store))),
        ("used rollouts, from the horizon", timed(lambda: projection.used_rollouts(store, since))),
        ("steps of a 48-rollout batch (960 steps)", timed(lambda: projection.steps_of(store, batch))),
        ("scheduler pass, first after a start", timed(lambda: schedule_inputs(
            store, cfg, now_ms=now, pending_requests=set()))),
        ("scheduler pass, later (from the horizon)", timed(steady_pass)),
        ("scheduler pass, later, statistics kept", timed(kept_stats_pass)),
        ("scheduler pass, first after a restart", timed(restarted_pass)),
        ("batcher pass, first after a start", timed(lambda: batch_inputs(store, cfg))),
        ("batcher pass, later (from the horizon)", timed(lambda: batch_inputs(store, cfg, since_ms=since))),
        ("batcher pass, later, pool kept", timed(lambda: batch_inputs(store, cfg, since_ms=since, now_ms=now,
                                                                      slow=kept_stats))),
    ]


def curation_at_scale(steps: int, keep: Path | None, *, client: object = None, target: object = None) -> None:
    """Generate (or reuse, under ``keep``) a projection of ``steps`` steps and time the queries."""
    with tempfile.TemporaryDirectory() as d:
        if client is None:
            where = keep if keep is not None else Path(d)
            big = Store.open_dsn(f"chdb://{where / 'chdb'}", database="big")
        else:
            big = Store(client, "big", target)  # type: ignore[arg-type]
        fresh = not big.query("SELECT count() FROM system.tables WHERE database = 'big' AND name = 'actions'")[0][0]
        big.migrate()
        t0 = time.perf_counter()
        if fresh or not big.query("SELECT count() FROM big.trajectories")[0][0]:
            generate(big, steps)
        print(f"\ncuration queries at {steps} steps ({steps // 20} trajectories; generated in "
              f"{time.perf_counter() - t0:.1f} s), median of 5:")
        for name, ms in query_latencies(big, steps):
            print(f"  {name:<42} {ms:8.1f} ms")
        share = big.query("SELECT count() FROM big.requests WHERE event_time >= fromUnixTimestamp64Milli({s:Int64})",
                          {"s": schedule_inputs(big, DataConfig(), now_ms=int(time.time() * 1000),
                                                pending_requests=set())[0].open_since_ms})[0][0]
        print(f"  (the horizon: {share} of {steps // 20} requests are read by a later pass)")
        if client is None:
            big.close()


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--events", type=int, default=60_000)
    ap.add_argument("--steps", type=int, default=1_000_000)
    ap.add_argument("--passes", type=int, default=passes.MIN_PASSES,
                    help="passes per side (consumer, Python path, raw insert), interleaved pass by pass")
    ap.add_argument("--queries-only", action="store_true", help="only the curation queries at --steps")
    ap.add_argument("--store", type=Path, help="keep the generated store here and reuse it (queries only)")
    args = ap.parse_args()
    if args.queries_only:
        curation_at_scale(args.steps, args.store)
        return
    with tempfile.TemporaryDirectory() as d, DevBroker() as broker:
        tmp = Path(d)
        store = Store.open_dsn(f"chdb://{tmp / 'chdb'}", database="ingest")
        store.migrate()
        events = log_of(args.events)
        bus = BusConfig(bootstrap=broker.bootstrap, prefix="bench", session_timeout_ms=3000, heartbeat_interval_ms=500)
        ensure_topics(bus)
        produce(bus, events)
        # Both paths and the raw insert in every pass, interleaved, each pass a fresh consumer
        # group and a fresh database over the same log.
        runs: dict[str, list[ConsumerRun]] = {"ClickHouse path": [], "Python path": []}

        def fresh(name: str) -> Store:
            s = Store(store.client, name, store.target)
            s.migrate()
            return s

        async def consumer_pass(i: int, clickhouse: bool) -> float:
            name = "ClickHouse path" if clickhouse else "Python path"
            r = await consumer_rate(bus, fresh(f"{'ch' if clickhouse else 'py'}_{i}"), events, tmp,
                                    clickhouse_decode=clickhouse)
            runs[name].append(r)
            return r.rate

        # interleave() is synchronous: each async pass runs on a loop of its own thread.
        def run_async(i: int, clickhouse: bool) -> float:
            with ThreadPoolExecutor(1) as ex:
                return ex.submit(asyncio.run, consumer_pass(i, clickhouse)).result()

        rates = passes.interleave({"consumer": lambda i: run_async(i, True),
                                   "python": lambda i: run_async(i, False),
                                   "raw": lambda i: raw_rate(fresh(f"raw_{i}"), events)},
                                  args.passes, on_pass=passes.pass_line("events/s"))
        checks, diffs = compare(store.query, "ch_0", store.query, "py_0", TABLES)
        assert all(c.equal for c in checks), format_checks(checks, diffs)
        counts = projection.table_counts(fresh("ch_0"), ["actions", "observations", "trajectories"])
        assert counts == projection.table_counts(fresh("raw_0"), ["actions", "observations", "trajectories"]), counts
        ch = runs["ClickHouse path"][0]
        print(f"projection of {len(events)} events ({counts['actions']} steps), chdb {store.client.server_version}, "
              f"{args.passes} passes per side, interleaved:")
        print(passes.report({"through the consumer (ClickHouse decodes)": rates["consumer"],
                             "raw clickhouse insert (same rows, one insert per table)": rates["raw"],
                             "Python decode path (the design before)": rates["python"]}, "events/s"))
        print(f"  ({ch.inserts} inserts per consumer pass, commit after each; ClickHouse decoded "
              f"{ch.by_clickhouse / len(events):.0%} of the records; every table of the Python path equal to the "
              f"ClickHouse path's)")
        print(passes.ratio_line(rates, "consumer", "raw"))
        print(passes.ratio_line(rates, "python", "raw"))
        raw = rates["raw"].median
        for name, rs in runs.items():
            wall = statistics.median(r.wall_s for r in rs)
            handler = statistics.median(r.handler_s for r in rs)
            cpu = statistics.median(r.cpu_s for r in rs)
            print(f"  ({name}, medians: {wall:.2f} s wall, of which {handler:.2f} s in the projection handler, the "
                  f"rest fetching and committing; {cpu / len(events) * 1e6:.0f} µs CPU per event in this process)")
        dec, rows = cpu_rates(events)
        print(f"  (Python path, alone: Avro decode {dec:.0f} events/s, row mapping {rows:.0f} events/s; "
              f"its ceiling {(1 / raw) / (1 / dec + 1 / rows + 1 / raw):.2f} of raw)")
        alone_store = Store(store.client, "sql_alone", store.target)
        alone_store.migrate()
        sql_alone = sql_rate(alone_store, events)
        print(f"  (ClickHouse path, alone, no broker, one pass: {sql_alone:.0f} events/s = {sql_alone / raw:.2f} of "
              f"the raw median)")
        curation_at_scale(args.steps, None, client=store.client, target=store.target)
        store.close()


if __name__ == "__main__":
    asyncio.run(main())
