"""The env worker on a real broker and blob store, with the oracle as the policy."""

from __future__ import annotations

import asyncio
import json
from collections import Counter

import pytest

from dart.bus import Producer, read_topic
from dart.env.synthetic import LatencyConfig, SyntheticBackend, SyntheticConfig, generate_tasks, oracle_plan
from dart.env.worker import EnvWorker, EnvWorkerConfig
from dart.events import RolloutRequested, TrajectoryStatus, WorkerHeartbeat

pytestmark = pytest.mark.kafka


def _tasks():
    return generate_tasks(3, preset="tiny", seed=1) + generate_tasks(3, preset="forms", seed=1)


def _worker(bus, blobs, **kw):
    synthetic = kw.pop("synthetic", SyntheticConfig(latency=LatencyConfig(kind="fixed", median_s=0.01), seed=0))
    cfg = EnvWorkerConfig(backend="synthetic", slots=kw.pop("slots", 3), heartbeat_s=0.5, synthetic=synthetic,
                          worker_id=kw.pop("worker_id", "env-a"), run_id="test", **kw)
    return EnvWorker(cfg, bus, blobs)


async def _start(worker):
    run = asyncio.create_task(worker.run())
    await worker.ready(30)
    return run


async def _stop(run):
    run.cancel()
    await asyncio.gather(run, return_exceptions=True)


async def test_worker_solves_synthetic_tasks_with_reward_one(bus, blobs, kit):
    bus = kit.fast_bus(bus)
    tasks = _tasks()
    plans = {t["id"]: oracle_plan(t) for t in tasks}
    producer = Producer(bus, client_id="test")
    await kit.register_tasks(bus, producer, tasks, "synthetic")
    worker = _worker(bus, blobs)
    async with kit.OracleResponder(bus, plans) as oracle:
        run = await _start(worker)
        reqs = [kit.request(t["id"], max_steps=20) for t in tasks]
        for r in reqs:
            await producer.send(r)
        trajs, rewards = await kit.results(bus, lambda ts: len(ts) >= len(reqs))
        heartbeats = await kit.collect(bus, bus.topics.heartbeats, WorkerHeartbeat,
                                       lambda hs: any(h.busy_s > 0 for h in hs), 10)
        await _stop(run)
    assert sorted(t.rollout_id for t in trajs) == sorted(f"{r.request_id}.0" for r in reqs)
    assert {t.status for t in trajs} == {TrajectoryStatus.SUCCESS}
    assert {t.finish_reason for t in trajs} == {"env_done"}
    by_task = {t.task_id: t for t in trajs}
    assert all(by_task[tid].num_steps == len(plan) for tid, plan in plans.items())
    assert all(t.step_policy_versions == [7] * t.num_steps for t in trajs)
    assert sorted(r.reward for r in rewards) == [1.0] * len(reqs)
    assert {r.evaluator for r in rewards} == {"synthetic_state_match"}
    # each observation carries every earlier turn, and its screenshot is in the blob store
    multi = [o for o in oracle.observations if o.step_index > 0]
    assert multi and all(len(o.history) == o.step_index for o in oracle.observations)
    assert all(blobs.exists(o.screenshot_digest) for o in oracle.observations)
    assert [h.step_index for h in max(multi, key=lambda o: o.step_index).history] == list(
        range(max(o.step_index for o in multi)))
    # every turn samples under a seed of its own, drawn from the request's: with the request's seed
    # at every turn, a seeded engine repeats the same random draws and a trajectory is one draw
    assert all(o.sampling == kit.SAMPLING.at_step(o.step_index) for o in oracle.observations)
    longest = [o.sampling.seed for o in oracle.observations if o.rollout_id == max(multi, key=lambda o: o.step_index).rollout_id]
    assert len(longest) == len(set(longest)) >= 2
    hb = [h for h in heartbeats if h.worker_id == "env-a"]
    assert hb and hb[-1].slots == 3 and hb[-1].role == "env"
    assert max(h.busy_s for h in hb) > 0
    producer.close()


async def test_garbled_answers_are_invalid_steps_and_the_trajectory_goes_on(bus, blobs, kit):
    bus = kit.fast_bus(bus)
    tasks = generate_tasks(2, preset="tiny", seed=5)
    plans = {t["id"]: oracle_plan(t) for t in tasks}
    producer = Producer(bus, client_id="test")
    await kit.register_tasks(bus, producer, tasks, "synthetic")
    worker = _worker(bus, blobs, slots=2)
    async with kit.OracleResponder(bus, plans, garble=lambda obs: obs.step_index < 2):
        run = await _start(worker)
        for t in tasks:
            await producer.send(kit.request(t["id"], max_steps=10))
        trajs, rewards = await kit.results(bus, lambda ts: len(ts) >= 2)
        await _stop(run)
    assert {t.status for t in trajs} == {TrajectoryStatus.SUCCESS}
    assert all(t.num_steps == len(plans[t.task_id]) + 2 for t in trajs)
    assert [json.loads(r.details)["invalid_steps"] for r in rewards] == [2, 2]
    producer.close()


async def test_step_limit_is_a_timeout_with_its_reward(bus, blobs, kit):
    bus = kit.fast_bus(bus)
    task = generate_tasks(1, preset="forms", seed=2)[0]
    producer = Producer(bus, client_id="test")
    await kit.register_tasks(bus, producer, [task], "synthetic")
    worker = _worker(bus, blobs, slots=1)
    async with kit.OracleResponder(bus, {task["id"]: oracle_plan(task)}):
        run = await _start(worker)
        await producer.send(kit.request(task["id"], max_steps=2))
        trajs, rewards = await kit.results(bus, lambda ts: len(ts) >= 1)
        await _stop(run)
    assert [(t.status, t.num_steps, t.finish_reason) for t in trajs] == [(TrajectoryStatus.TIMEOUT, 2, "max_steps")]
    assert [r.reward for r in rewards] == [0.0]
    producer.close()


async def test_reply_timeout_is_an_infra_error_and_the_request_is_redone(bus, blobs, kit):
    bus = kit.fast_bus(bus)
    task = generate_tasks(1, preset="tiny", seed=3)[0]
    producer = Producer(bus, client_id="test")
    await kit.register_tasks(bus, producer, [task], "synthetic")
    worker = _worker(bus, blobs, slots=1, reply_timeout_s=1.0)
    created = []
    factory = worker.factory
    worker.factory = lambda slot: created.append(slot) or factory(slot)
    # the policy never answers the first attempt
    async with kit.OracleResponder(bus, {task["id"]: oracle_plan(task)}, ignore=lambda obs: obs.rollout_id.endswith(".0")):
        run = await _start(worker)
        req = kit.request(task["id"])
        await producer.send(req)
        trajs, rewards = await kit.results(bus, lambda ts: len(ts) >= 2)
        await _stop(run)
    by_id = {t.rollout_id: t for t in trajs}
    first, second = by_id[f"{req.request_id}.0"], by_id[f"{req.request_id}.1"]
    assert first.status == TrajectoryStatus.INFRA_ERROR and "no action" in first.error
    assert second.status == TrajectoryStatus.SUCCESS
    assert [r.rollout_id for r in rewards] == [second.rollout_id]  # never a reward for the failure
    assert created == [0]  # the slot's backend was recycled after the failure
    producer.close()


async def test_crashing_backend_yields_infra_errors_requeues_and_no_reward(bus, blobs, kit):
    bus = kit.fast_bus(bus)
    task = generate_tasks(1, preset="tiny", seed=4)[0]
    producer = Producer(bus, client_id="test")
    await kit.register_tasks(bus, producer, [task], "synthetic")
    worker = _worker(bus, blobs, slots=2, max_attempts=3, synthetic=SyntheticConfig(crash_p=1.0, seed=0))
    async with kit.OracleResponder(bus, {task["id"]: oracle_plan(task)}):
        run = await _start(worker)
        req = kit.request(task["id"])
        await producer.send(req)
        trajs, rewards = await kit.results(bus, lambda ts: len(ts) >= 3)
        await asyncio.sleep(0.5)
        trajs, rewards = await kit.results(bus, lambda ts: True)
        await _stop(run)
    assert sorted((t.attempt, t.status) for t in trajs) == [(a, TrajectoryStatus.INFRA_ERROR) for a in range(3)]
    assert all("injected crash" in t.error for t in trajs)
    assert rewards == []
    requests = [d.event async for d in read_topic(bus, bus.topics.requests, idle_timeout_s=0.5)]
    assert sorted(r.attempt for r in requests if isinstance(r, RolloutRequested)) == [0, 1, 2]  # 3 tries, no 4th
    producer.close()


async def test_a_killed_worker_loses_no_request(bus, blobs, kit):
    bus = kit.fast_bus(bus)
    tasks = generate_tasks(6, preset="tiny", seed=6)
    plans = {t["id"]: oracle_plan(t) for t in tasks}
    producer = Producer(bus, client_id="test")
    await kit.register_tasks(bus, producer, tasks, "synthetic")
    slow = SyntheticConfig(latency=LatencyConfig(kind="fixed", median_s=0.4, reset_factor=1.0), seed=0)
    async with kit.OracleResponder(bus, plans) as oracle:
        a = _worker(bus, blobs, slots=2, worker_id="env-a", synthetic=slow)
        run_a = await _start(a)
        reqs = [kit.request(t["id"]) for t in tasks]
        for r in reqs:
            await producer.send(r)
        while not oracle.observations:  # worker a is in the middle of trajectories
            await asyncio.sleep(0.05)
        await _stop(run_a)  # killed: nothing it had in hand was committed
        b = _worker(bus, blobs, slots=3, worker_id="env-b")
        run_b = await _start(b)
        done = {f"{r.request_id}.0" for r in reqs}
        trajs, _ = await kit.results(
            bus, lambda ts: done <= {t.rollout_id for t in ts if t.status == TrajectoryStatus.SUCCESS}, 60)
        await _stop(run_b)
    succeeded = Counter(t.rollout_id for t in trajs if t.status == TrajectoryStatus.SUCCESS)
    assert set(succeeded) == done
    assert {t.env_worker for t in trajs} >= {"env-b"}
    observed_a = {o.request_id for o in oracle.observations if o.env_worker == "env-a"}
    finished_a = {t.request_id for t in trajs if t.env_worker == "env-a"}
    in_hand = observed_a - finished_a
    assert in_hand  # a really died with requests in hand ...
    assert in_hand <= {t.request_id for t in trajs if t.env_worker == "env-b"}  # ... and b redid them
    producer.close()


async def test_unhealthy_backend_is_recycled_before_a_trajectory(bus, blobs, kit):
    bus = kit.fast_bus(bus)
    task = generate_tasks(1, preset="tiny", seed=8)[0]
    producer = Producer(bus, client_id="test")
    await kit.register_tasks(bus, producer, [task], "synthetic")
    worker = _worker(bus, blobs, slots=1)
    await worker._backends[0].close()  # a dead slot: health() is not ok
    assert isinstance(worker._backends[0], SyntheticBackend)
    async with kit.OracleResponder(bus, {task["id"]: oracle_plan(task)}):
        run = await _start(worker)
        await producer.send(kit.request(task["id"]))
        trajs, rewards = await kit.results(bus, lambda ts: len(ts) >= 1)
        await _stop(run)
    assert [t.status for t in trajs] == [TrajectoryStatus.SUCCESS]
    assert [r.reward for r in rewards] == [1.0]
    producer.close()



async def test_a_sigkilled_worker_process_loses_no_request(bus, blobs, kit, tmp_path):
    """`dart env-worker` in a subprocess, killed with SIGKILL mid-trajectory (no goodbye to the
    group): its requests were never committed, so the next worker redoes them."""
    import signal
    import subprocess
    import sys

    import yaml

    bus = kit.fast_bus(bus)
    tasks = generate_tasks(4, preset="tiny", seed=11)
    plans = {t["id"]: oracle_plan(t) for t in tasks}
    producer = Producer(bus, client_id="test")
    await kit.register_tasks(bus, producer, tasks, "synthetic")
    config = tmp_path / "env.yaml"
    config.write_text(yaml.safe_dump({
        "bus": {"bootstrap": bus.bootstrap, "prefix": bus.prefix, "session_timeout_ms": 2000,
                "heartbeat_interval_ms": 500},
        "env": {"backend": "synthetic", "slots": 2, "blobs": str(blobs.root), "worker_id": "env-proc",
                "run_id": "test", "synthetic": {"latency": {"kind": "fixed", "median_s": 0.5}}},
    }))
    async with kit.OracleResponder(bus, plans) as oracle:
        proc = subprocess.Popen([sys.executable, "-m", "dart.cli", "env-worker", str(config)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            reqs = [kit.request(t["id"]) for t in tasks]
            for r in reqs:
                await producer.send(r)
            deadline = asyncio.get_running_loop().time() + 60
            while not any(o.env_worker == "env-proc" for o in oracle.observations):
                assert proc.poll() is None and asyncio.get_running_loop().time() < deadline
                await asyncio.sleep(0.05)
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
        b = _worker(bus, blobs, slots=2, worker_id="env-b")
        run_b = await _start(b)
        done = {f"{r.request_id}.0" for r in reqs}
        trajs, rewards = await kit.results(
            bus, lambda ts: done <= {t.rollout_id for t in ts if t.status == TrajectoryStatus.SUCCESS}, 60)
        await _stop(run_b)
    assert {t.rollout_id for t in trajs if t.status == TrajectoryStatus.SUCCESS} == done
    assert not [t for t in trajs if t.env_worker == "env-proc"]  # it died before finishing any
    assert {r.rollout_id for r in rewards} == done
    producer.close()


async def test_undecodable_requests_go_to_the_dlq_with_the_reason_and_the_worker_goes_on(bus, blobs, kit):
    bus = kit.fast_bus(bus)
    tasks = generate_tasks(1, preset="tiny", seed=3)
    producer = Producer(bus, client_id="test")
    await kit.register_tasks(bus, producer, tasks, "synthetic")
    worker = _worker(bus, blobs, slots=1)
    async with kit.OracleResponder(bus, {t["id"]: oracle_plan(t) for t in tasks}):
        run = await _start(worker)
        for poison in (b"\xc3\x01" + bytes(8) + b"not a request", b"\x00" * 3, b"{\"json\": true}"):
            await producer.send_raw(poison, bus.topics.requests, b"poison")
        good = kit.request(tasks[0]["id"], max_steps=20)
        await producer.send(good)
        trajs, _ = await kit.results(bus, lambda ts: len(ts) >= 1)
        await _stop(run)
    assert [t.rollout_id for t in trajs] == [f"{good.request_id}.0"]
    letters = [d.event async for d in read_topic(bus, bus.topics.dlq, idle_timeout_s=1.0)]
    assert len(letters) == 3
    assert {(lt.stage, lt.error_type, lt.source_topic) for lt in letters} == {("decode", "DecodeError", bus.topics.requests)}
    assert all(lt.error and lt.key == b"poison" for lt in letters)
    producer.close()
