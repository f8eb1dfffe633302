"""Env-slot utilization of one env worker under rollout-wise scheduling, through a real broker.

One env worker with ``--slots`` synthetic slots (step latency lognormal: median ``--median-s``,
p99 ``--p99-s``), a scripted policy that answers every observation after ``--policy-s`` (fixed),
and a DevBroker (Tansu) in between. Enough requests are queued that no slot ever runs dry.

Busy = the time a slot holds a trajectory: reset, env steps, waiting for the policy's answer,
evaluation and emitting its results. Utilization = busy slot-seconds / wall slot-seconds over
a steady-state window (after every slot has started once, before the queue drains), read from
the worker's own clock and from its WorkerHeartbeat events on the log. Goal: >= 0.95.

    .venv/bin/python benchmarks/env_utilization.py [--slots 8] [--window-s 20] [--json OUT]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from dart.agent.actions import Finished, to_wire
from dart.blobs import LocalBlobStore
from dart.bus import BusConfig, Consumer, DevBroker, Producer, ensure_topics, read_topic
from dart.env.slots import utilization
from dart.env.synthetic import LatencyConfig, SyntheticConfig, generate_tasks, oracle_plan
from dart.env.worker import EnvWorker, EnvWorkerConfig
from dart.events import (
    ActionChosen,
    ObservationEmitted,
    RolloutRequested,
    Sampling,
    TaskRegistered,
    TrajectoryFinished,
    WorkerHeartbeat,
)


class ScriptedPolicy:
    """Answers each observation with the oracle's next action after a fixed latency."""

    def __init__(self, bus: BusConfig, plans: dict[str, list[Any]], latency_s: float) -> None:
        self.plans, self.latency_s = plans, latency_s
        self.given: dict[tuple[str, str], int] = {}
        self.producer = Producer(bus, client_id="policy")
        self.consumer = Consumer(bus, topics=[bus.topics.observations], group="policy", handler=self.on_obs,
                                 producer=self.producer)
        self.pending: set[asyncio.Task[None]] = set()

    async def on_obs(self, d: Any) -> None:
        task = asyncio.create_task(self.answer(d.event))
        self.pending.add(task)
        task.add_done_callback(self.pending.discard)

    async def answer(self, obs: ObservationEmitted) -> None:
        await asyncio.sleep(self.latency_s)
        key = (obs.env_worker, obs.rollout_id)
        k = self.given.get(key, 0)
        self.given[key] = k + 1
        plan = self.plans[obs.task_id]
        action = plan[k] if k < len(plan) else Finished()
        await self.producer.reply(obs.reply, ActionChosen.new(
            run_id="bench", producer="policy", in_reply_to=obs.event_id, rollout_id=obs.rollout_id,
            request_id=obs.request_id, task_id=obs.task_id, step_index=obs.step_index, response_text=repr(action),
            actions=[to_wire(action)], response_token_ids=[], logprobs=[], entropies=[], policy_version=0,
            prompt_hash="", prompt_tokens=0, finish_reason="stop", engine="scripted", queue_s=0.0,
            generate_s=self.latency_s, sampling=obs.sampling,
        ))


async def bench(args: argparse.Namespace, bootstrap: str, root: Path) -> dict[str, Any]:
    bus = BusConfig(bootstrap=bootstrap, prefix=f"bench{uuid.uuid4().hex[:6]}", session_timeout_ms=2000,
                    heartbeat_interval_ms=500)
    ensure_topics(bus)
    tasks = generate_tasks(args.tasks, preset=args.preset, seed=0)
    plans = {t["id"]: oracle_plan(t) for t in tasks}
    producer = Producer(bus, client_id="bench")
    for t in tasks:
        await producer.send(TaskRegistered.new(run_id="bench", producer="bench", task_id=t["id"], domain="synthetic",
                                               instruction=t["instruction"], backend="synthetic",
                                               task_json=json.dumps(t)))
    latency = LatencyConfig(kind="lognormal", median_s=args.median_s, p99_s=args.p99_s)
    cfg = EnvWorkerConfig(backend="synthetic", slots=args.slots, worker_id="env-bench", run_id="bench",
                          heartbeat_s=1.0, synthetic=SyntheticConfig(latency=latency, seed=0))
    worker = EnvWorker(cfg, bus, LocalBlobStore(root / "blobs"))
    policy = ScriptedPolicy(bus, plans, args.policy_s)
    policy_run = asyncio.create_task(policy.consumer.run())
    await policy.consumer.started.wait()
    run = asyncio.create_task(worker.run())
    await worker.ready(30)
    sampling = Sampling(temperature=1.0, top_p=1.0, max_new_tokens=64, seed=1)
    for i in range(args.requests):
        t = tasks[i % len(tasks)]
        await producer.send(RolloutRequested.new(
            run_id="bench", producer="bench", request_id=str(uuid.uuid4()), task_id=t["id"], group_id=f"g{i}",
            rollout_index=0, group_size=1, max_steps=30, sampling=sampling))
    while worker.clock.busy_slots < args.slots:  # warm-up: every slot holds a trajectory
        await asyncio.sleep(0.01)
    t0, (busy0, idle0), done0 = time.monotonic(), worker.clock.totals(time.monotonic()), worker.counts["trajectories"]
    await asyncio.sleep(args.window_s)
    t1, (busy1, idle1), done1 = time.monotonic(), worker.clock.totals(time.monotonic()), worker.counts["trajectories"]
    steps = worker.counts["steps"]
    queued_left = worker._queue.qsize()
    run.cancel()
    await asyncio.gather(run, return_exceptions=True)
    policy.consumer.stop()
    await policy_run
    heartbeats = [d.event async for d in read_topic(bus, bus.topics.heartbeats, idle_timeout_s=1.0)
                  if isinstance(d.event, WorkerHeartbeat) and d.event.worker_id == "env-bench" and d.event.slots]
    trajs = [d.event async for d in read_topic(bus, bus.topics.trajectories, idle_timeout_s=1.0)
             if isinstance(d.event, TrajectoryFinished)]
    producer.close()
    policy.producer.close()
    # the heartbeats the worker published inside the window, first to last
    start = worker.clock.start
    inside = sorted((h for h in heartbeats if t0 - start <= h.uptime_s <= t1 - start), key=lambda h: h.uptime_s)
    hb_util = None
    if len(inside) >= 2:
        a, b = inside[0], inside[-1]
        hb_util = utilization(b.busy_s - a.busy_s, b.idle_s - a.idle_s)
    parts = {k: sum(getattr(t, k) for t in trajs) for k in ("reset_s", "env_s", "policy_wait_s", "eval_s")}
    total = sum(parts.values()) or 1.0
    return {
        "slots": args.slots,
        "step_latency": {"kind": "lognormal", "median_s": args.median_s, "p99_s": args.p99_s},
        "policy_latency_s": args.policy_s,
        "window_s": round(t1 - t0, 2),
        "utilization": round(utilization(busy1 - busy0, idle1 - idle0), 5),
        "utilization_heartbeats": None if hb_util is None else round(hb_util, 4),
        "idle_slot_s": round(idle1 - idle0, 3),
        "trajectories_in_window": done1 - done0,
        "trajectories_per_s": round((done1 - done0) / (t1 - t0), 2),
        "steps_total": steps,
        "busy_shares": {k: round(v / total, 3) for k, v in parts.items()},
        "batch_sync_estimate": round(batch_sync_utilization(trajs, args.slots), 3),
        "queue_never_empty": queued_left > 0 or args.requests > done1 + args.slots,
    }


def batch_sync_utilization(trajs: list[TrajectoryFinished], slots: int) -> float:
    """What the same trajectories would give a coupled, batch-wise scheduler: ``slots`` of them
    start together and every slot waits for the longest (the DART paper's baseline)."""
    durations = [t.reset_s + t.env_s + t.policy_wait_s + t.eval_s for t in trajs]
    batches = [durations[i : i + slots] for i in range(0, len(durations) - slots + 1, slots)]
    return sum(sum(b) for b in batches) / max(1e-9, sum(slots * max(b) for b in batches))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--slots", type=int, default=8)
    p.add_argument("--median-s", type=float, default=0.2, help="median env step latency")
    p.add_argument("--p99-s", type=float, default=1.0, help="99th percentile env step latency")
    p.add_argument("--policy-s", type=float, default=0.05, help="fixed policy answer latency")
    p.add_argument("--window-s", type=float, default=20.0, help="steady-state measuring window")
    p.add_argument("--preset", default="forms", choices=["tiny", "buttons", "forms"])
    p.add_argument("--tasks", type=int, default=50)
    p.add_argument("--requests", type=int, default=400)
    p.add_argument("--json", type=Path, help="also write the result here")
    args = p.parse_args()
    logging.basicConfig(level=logging.WARNING)
    with tempfile.TemporaryDirectory() as tmp, DevBroker() as broker:
        result = asyncio.run(bench(args, broker.bootstrap, Path(tmp)))
    print("busy = time a slot holds a trajectory: reset, env steps, waiting for the policy, evaluation, emitting")
    print(json.dumps(result, indent=1))
    ok = result["utilization"] >= 0.95
    sync = result["batch_sync_estimate"]
    print(f"env slot utilization {result['utilization']:.5f} (goal >= 0.95; batch-wise estimate {sync}): "
          f"{'OK' if ok else 'BELOW GOAL'}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
