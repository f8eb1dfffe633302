"""The synthetic backend as an EnvBackend: latency, crashes, state access, evaluation."""

from __future__ import annotations

import json
import time

import pytest

from dart.agent.actions import CallUser, Click
from dart.env.synthetic import (
    STATE_PATH,
    LatencyConfig,
    SyntheticBackend,
    SyntheticConfig,
    generate_tasks,
    oracle_plan,
)
from dart.env.tasks import Task
from dart.errors import EnvError


def _task():
    return generate_tasks(1, preset="forms", seed=4)[0]


async def test_oracle_plan_scores_one_through_the_evaluators():
    task = _task()
    env = SyntheticBackend()
    obs = await env.reset(Task.from_dict(task, domain="synthetic"))
    assert (obs.width, obs.height) == (448, 336) and obs.screenshot_png.startswith(b"\x89PNG")
    for a in oracle_plan(task):
        obs = await env.step(a)
    assert obs.info["done"]
    score, details = await env.evaluate(task, final_action=None)
    assert score == 1.0 and details["metrics"] == [{"func": "synthetic_state_match", "score": 1.0}]
    state = json.loads(await env.read_file(STATE_PATH))
    assert state["submitted"] == "submit"
    # giving up on a feasible task is 0 whatever the state says
    assert (await env.evaluate(task, final_action=CallUser()))[0] == 0.0


async def test_unsolved_task_scores_zero():
    task = _task()
    env = SyntheticBackend()
    await env.reset(task)
    await env.step(Click(x=1, y=1))
    assert (await env.evaluate(task, final_action=None))[0] == 0.0


async def test_latency_is_slept_in_reset_and_step():
    # 0.2 s a step, 0.4 s a reset: the upper bounds catch a latency slept twice (0.8 s, 0.4 s)
    # with room for a busy machine's late wake-ups.
    lat = LatencyConfig(kind="fixed", median_s=0.2, reset_factor=2.0)
    env = SyntheticBackend(SyntheticConfig(latency=lat))
    t = time.monotonic()
    await env.reset(_task())
    reset_s = time.monotonic() - t
    t = time.monotonic()
    await env.step(Click(x=1, y=1))
    step_s = time.monotonic() - t
    assert 0.4 <= reset_s < 0.75 and 0.2 <= step_s < 0.38


async def test_crash_breaks_the_slot_until_it_is_recycled():
    env = SyntheticBackend(SyntheticConfig(crash_p=1.0, seed=1))
    assert (await env.health()).ok
    with pytest.raises(EnvError, match="injected crash in reset"):
        await env.reset(_task())
    health = await env.health()
    assert not health.ok and "injected crash" in health.detail
    with pytest.raises(EnvError, match="broken"):
        await env.read_file(STATE_PATH)


async def test_crash_probability_is_seeded():
    def crashes(seed):
        env = SyntheticBackend(SyntheticConfig(crash_p=0.3, seed=seed))
        out = []
        for _ in range(30):
            env._broken = None
            try:
                env._maybe_crash("step")
                out.append(False)
            except EnvError:
                out.append(True)
        return out

    assert crashes(3) == crashes(3) and 3 <= sum(crashes(3)) <= 18


async def test_env_access_is_limited_to_the_state_file():
    env = SyntheticBackend()
    with pytest.raises(FileNotFoundError):
        await env.read_file(STATE_PATH)  # nothing before a reset
    await env.reset(_task())
    with pytest.raises(FileNotFoundError):
        await env.read_file("/etc/passwd")
    assert (await env.run_command(["ls"])).returncode == 127
    await env.close()
    assert not (await env.health()).ok
    with pytest.raises(EnvError, match="closed"):
        await env.step(Click(x=1, y=1))
