"""Env-area fixtures: a scripted policy (the oracle) answering observations over the broker,
and helpers to register tasks, request rollouts and collect results."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import http.server
import json
import shutil
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from dart.agent.actions import Action, Finished, to_wire
from dart.bus import BusConfig, Consumer, Producer, read_topic
from dart.events import (
    ActionChosen,
    ObservationEmitted,
    ParsedAction,
    RewardAssigned,
    RolloutRequested,
    Sampling,
    TaskRegistered,
    TrajectoryFinished,
)

SAMPLING = Sampling(temperature=0.7, top_p=1.0, max_new_tokens=64, seed=1)
GARBLE = ParsedAction(kind="invalid", text="could not parse: 'clikc(start_box=...'")


def fast_bus(bus: BusConfig) -> BusConfig:
    """The test bus with a short group session: Tansu needs about half of it to finish a join."""
    return dataclasses.replace(bus, session_timeout_ms=2000, heartbeat_interval_ms=500)


class OracleResponder:
    """A rollout-worker stand-in: answers each observation with the next action of a scripted
    plan (``plans[task_id]``), or garbage / silence when the test says so."""

    def __init__(self, bus: BusConfig, plans: dict[str, list[Action]], *, latency_s: float = 0.0,
                 garble: Callable[[ObservationEmitted], bool] = lambda obs: False,
                 ignore: Callable[[ObservationEmitted], bool] = lambda obs: False) -> None:
        self.bus = bus
        self.plans = plans
        self.latency_s = latency_s
        self.garble = garble
        self.ignore = ignore
        self.given: dict[tuple[str, str], int] = {}
        self.observations: list[ObservationEmitted] = []
        self.producer = Producer(bus, client_id="oracle")
        self.consumer = Consumer(bus, topics=[bus.topics.observations], group=f"oracle-{uuid.uuid4().hex[:6]}",
                                 handler=self._on_obs, producer=self.producer)
        self._tasks: set[asyncio.Task[None]] = set()

    async def _on_obs(self, d: Any) -> None:
        obs = d.event
        assert isinstance(obs, ObservationEmitted)
        self.observations.append(obs)
        if self.ignore(obs):
            return
        task = asyncio.create_task(self._answer(obs))  # answer concurrently, like a batching engine
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _answer(self, obs: ObservationEmitted) -> None:
        if self.latency_s:
            await asyncio.sleep(self.latency_s)
        if self.garble(obs):
            actions, text = [GARBLE], "Action: clikc(start_box="
        else:
            key = (obs.env_worker, obs.rollout_id)  # a redo elsewhere (same rollout id) starts over
            k = self.given.get(key, 0)
            self.given[key] = k + 1
            plan = self.plans[obs.task_id]
            action = plan[k] if k < len(plan) else Finished(content="done")  # the plan is through
            actions, text = [to_wire(action)], f"Action: {action!r}"
        await self.producer.reply(obs.reply, ActionChosen.new(
            run_id="test", producer="oracle", in_reply_to=obs.event_id, rollout_id=obs.rollout_id,
            request_id=obs.request_id, task_id=obs.task_id, step_index=obs.step_index, response_text=text,
            actions=actions, response_token_ids=[1, 2], logprobs=[-0.1, -0.2], entropies=[0.5, 0.5],
            policy_version=7, prompt_hash="h", prompt_tokens=10, finish_reason="stop", engine="oracle",
            queue_s=0.0, generate_s=self.latency_s, sampling=obs.sampling,
        ))

    async def __aenter__(self) -> OracleResponder:
        self._run = asyncio.create_task(self.consumer.run())
        await asyncio.wait_for(self.consumer.started.wait(), 30)
        return self

    async def __aexit__(self, *exc: Any) -> None:
        self.consumer.stop()
        await asyncio.wait_for(self._run, 15)
        for t in list(self._tasks):
            t.cancel()
        await asyncio.to_thread(self.producer.close)


async def register_tasks(bus: BusConfig, producer: Producer, tasks: list[dict[str, Any]], backend: str) -> None:
    for t in tasks:
        await producer.send(TaskRegistered.new(
            run_id="test", producer="test", task_id=t["id"], domain=t.get("domain", backend),
            instruction=t["instruction"], backend=backend, task_json=json.dumps(t),
        ))


def request(task_id: str, *, backend: str = "synthetic", max_steps: int = 10, attempt: int = 0,
            index: int = 0) -> RolloutRequested:
    return RolloutRequested.new(
        run_id="test", producer="test", request_id=str(uuid.uuid4()), task_id=task_id, group_id=f"g-{task_id}",
        rollout_index=index, group_size=1, max_steps=max_steps, attempt=attempt, backend=backend, sampling=SAMPLING,
    )


async def collect(bus: BusConfig, topic: str, cls: type, until: Callable[[list[Any]], bool],
                  timeout_s: float = 60.0) -> list[Any]:
    """Events of ``cls`` on ``topic`` once ``until(events)`` holds (re-reading the topic)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        events = [d.event async for d in read_topic(bus, topic, idle_timeout_s=0.5) if isinstance(d.event, cls)]
        if until(events) or loop.time() > deadline:
            return events
        await asyncio.sleep(0.3)


async def results(bus: BusConfig, until: Callable[[list[TrajectoryFinished]], bool], timeout_s: float = 60.0
                  ) -> tuple[list[TrajectoryFinished], list[RewardAssigned]]:
    trajs = await collect(bus, bus.topics.trajectories, TrajectoryFinished, until, timeout_s)
    rewards = await collect(bus, bus.topics.rewards, RewardAssigned, lambda r: True, 5)
    return trajs, rewards


@pytest.fixture(scope="session")
def xdesktop_available() -> None:
    missing = [t for t in ("Xvfb", "xdotool", "openbox", "mousepad", "soffice") if shutil.which(t) is None]
    if missing:
        pytest.skip(f"xdesktop tests need {', '.join(missing)} (apt-get install xvfb xdotool openbox mousepad "
                    "libreoffice-calc)")


class Kit:
    """The helpers above, as one fixture (test modules cannot import a conftest by name)."""

    OracleResponder = OracleResponder
    fast_bus = staticmethod(fast_bus)
    register_tasks = staticmethod(register_tasks)
    request = staticmethod(request)
    collect = staticmethod(collect)
    results = staticmethod(results)
    SAMPLING = SAMPLING


@pytest.fixture
def kit() -> type[Kit]:
    return Kit


@contextlib.contextmanager
def serve_folder(folder: Path) -> Iterator[str]:
    """A loopback HTTP server over ``folder``, as its base URL (no test here touches the internet)."""
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(folder))
    handler.log_message = lambda *a, **k: None  # type: ignore[attr-defined]
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
