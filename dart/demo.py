"""`dart demo`: a dev broker, a producer process and a `dart tail` process, to see events flow."""

from __future__ import annotations

import argparse
import subprocess
import sys
from typing import Any

from dart.bus.broker import DevBroker, ensure_topics
from dart.bus.config import BusConfig
from dart.bus.producer import Producer
from dart.events import RewardAssigned, TrajectoryFinished, TrajectoryStatus, now_ms


def register(sub: Any) -> None:
    p = sub.add_parser("demo", help="start a dev broker and show events flowing between processes")
    p.add_argument("--events", type=int, default=5, help="trajectories (and rewards) to produce")
    p.set_defaults(func=cmd_demo)


def cmd_demo(args: argparse.Namespace) -> int:
    """A broker, a producer process and a `dart tail` process: events flowing, decoded."""
    with DevBroker() as broker:
        cfg = BusConfig(bootstrap=broker.bootstrap, prefix="demo")
        ensure_topics(cfg)
        print(f"1. dev broker on {broker.bootstrap}, {len(cfg.topics.all())} topics (prefix 'demo')")
        env = {"DART_BOOTSTRAP": broker.bootstrap, "DART_TOPIC_PREFIX": "demo"}
        code = (
            "import asyncio,sys; from dart.demo import _demo_produce; "
            f"asyncio.run(_demo_produce({args.events}))"
        )
        subprocess.run([sys.executable, "-c", code], check=True, env={**_environ(), **env})
        print(f"2. another process produced {args.events} trajectories and rewards; `dart tail` decodes them:")
        subprocess.run([sys.executable, "-m", "dart.cli", "tail", "trajectories", "--max", str(args.events)],
                       check=True, env={**_environ(), **env})
    print("3. broker stopped")
    return 0


def _environ() -> dict[str, str]:
    import os

    return dict(os.environ)


async def _demo_produce(n: int) -> None:
    cfg = BusConfig.from_env()
    producer = Producer(cfg, client_id="demo")
    for i in range(n):
        status = TrajectoryStatus.SUCCESS if i % 2 == 0 else TrajectoryStatus.FAIL
        producer.send_nowait(TrajectoryFinished.new(
            run_id="demo", producer="demo-env", rollout_id=f"r{i}.0", request_id=f"r{i}", task_id=f"task-{i % 2}",
            group_id="g0", rollout_index=i, status=status, finish_reason="finished", num_steps=3 + i, max_steps=15,
            step_policy_versions=[0] * (3 + i), env_worker="demo-env", slot=0, reset_s=0.1, env_s=0.3,
            policy_wait_s=0.2, eval_s=0.01, started_at=now_ms()))
        producer.send_nowait(RewardAssigned.new(
            run_id="demo", producer="demo-env", rollout_id=f"r{i}.0", task_id=f"task-{i % 2}", group_id="g0",
            reward=1.0 if status is TrajectoryStatus.SUCCESS else 0.0, evaluator="demo", evaluator_version="1"))
    producer.close()
