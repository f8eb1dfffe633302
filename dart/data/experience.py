"""The experience pool lives on the log: imported trajectories become ordinary events.

``dart experience import FILE`` turns each trajectory of a JSON-lines file into the events
an online rollout would have produced — ObservationEmitted + ActionChosen per step,
TrajectoryFinished and RewardAssigned — written to the normal topics with
``mode="experience"`` (never scheduled, never an online group) and
``origin="experience"`` (or ``"oracle"`` for a scripted solver). The projection then holds
them like any trajectory; the batcher's pool is "successful trajectories whose origin is
experience or oracle". Event ids are derived from the content, so importing a file twice
changes nothing.

One line of the file::

    {"task_id": "t1", "instruction": "Open the file", "reward": 1.0,
     "screen_width": 1920, "screen_height": 1080,
     "steps": [{"screenshot": "shots/0.png",            # or "screenshot_digest": "<sha256>"
                "response_text": "Action: click(start_box='(10,20)')",
                "response_token_ids": [1, 2, 3],
                "logprobs": [-0.1, -0.2, -0.3],           # optional (empty: off-policy, SFT only)
                "entropies": [0.5, 0.4, 0.3],             # optional
                "prompt_hash": "", "policy_version": 0}]} # optional
"""

from __future__ import annotations

import hashlib
import json
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from dart.events import (
    ActionChosen,
    Event,
    ObservationEmitted,
    ReplyRoute,
    RewardAssigned,
    Sampling,
    TrajectoryFinished,
    TrajectoryStatus,
)
from dart.events.manifest import Sample, step_contexts

NAMESPACE = uuid.UUID("6f1c3c1e-4d7b-4a59-9a51-5f0d9c7e2a10")
PRODUCER = "experience-import"
EXPERIENCE_MODE = "experience"
"""The ``mode`` of every imported step and trajectory: never scheduled, never sampled."""
NO_SAMPLING = Sampling(temperature=0.0, top_p=1.0, max_new_tokens=0, seed=0)
NO_ROUTE = ReplyRoute(topic="", partition=0, worker_id="")


def _id(*parts: object) -> str:
    return str(uuid.uuid5(NAMESPACE, "/".join(map(str, parts))))


def _require(record: dict[str, Any], key: str, kind: type | tuple[type, ...]) -> Any:
    if key not in record:
        raise ValueError(f"missing field {key!r}")
    if not isinstance(record[key], kind):
        raise ValueError(f"field {key!r} must be {kind}, got {type(record[key]).__name__}")
    return record[key]


def experience_events(record: dict[str, Any], *, run_id: str, origin: str, at_ms: int,
                      digest_of: Callable[[dict[str, Any]], str]) -> list[Event]:
    """The events of one imported trajectory (pure but for ``digest_of``, which resolves a
    step's screenshot to a blob digest)."""
    task_id = _require(record, "task_id", str)
    instruction = _require(record, "instruction", str)
    steps = _require(record, "steps", list)
    if not steps:
        raise ValueError("a trajectory needs at least one step")
    reward = float(record.get("reward", 1.0))
    width, height = int(record.get("screen_width", 1920)), int(record.get("screen_height", 1080))
    canonical = json.dumps(record, sort_keys=True, separators=(",", ":"))
    rollout_id = str(record.get("rollout_id") or _id("rollout", hashlib.sha256(canonical.encode()).hexdigest()))
    group_id = f"experience:{task_id}"
    env = dict(run_id=run_id, producer=PRODUCER)
    events: list[Event] = []
    for i, step in enumerate(steps):
        if not isinstance(step, dict):
            raise ValueError(f"steps[{i}] must be an object")
    texts = [_require(step, "response_text", str) for step in steps]
    contexts = step_contexts(instruction, (width, height), [(digest_of(step), text) for step, text in zip(
        steps, texts, strict=True)])
    versions = [int(step.get("policy_version", 0)) for step in steps]
    for step, ctx, text, version in zip(steps, contexts, texts, versions, strict=True):
        i = ctx.step_index
        tokens = [int(t) for t in _require(step, "response_token_ids", list)]
        obs = ObservationEmitted(
            event_id=_id(rollout_id, "obs", i), event_time=at_ms, **env, rollout_id=rollout_id,
            request_id=rollout_id, task_id=task_id, group_id=group_id, step_index=i, instruction=instruction,
            screenshot_digest=ctx.screenshot_digest, screen_width=width, screen_height=height, history=ctx.history,
            reply=NO_ROUTE, sampling=NO_SAMPLING, max_steps=len(steps), mode=EXPERIENCE_MODE, env_worker=PRODUCER,
            slot=0)
        events.append(obs)
        events.append(ActionChosen(
            event_id=_id(rollout_id, "act", i), event_time=at_ms, **env, in_reply_to=obs.event_id,
            rollout_id=rollout_id, request_id=rollout_id, task_id=task_id, step_index=i, response_text=text,
            actions=[], response_token_ids=tokens, logprobs=[float(x) for x in step.get("logprobs", [])],
            entropies=[float(x) for x in step.get("entropies", [])], policy_version=version,
            prompt_hash=str(step.get("prompt_hash", "")), prompt_tokens=0, finish_reason="stop",
            engine=origin, queue_s=0.0, generate_s=0.0, sampling=NO_SAMPLING))
    status = TrajectoryStatus.SUCCESS if reward > 0 else TrajectoryStatus.FAIL
    events.append(TrajectoryFinished(
        event_id=_id(rollout_id, "finished"), event_time=at_ms, **env, rollout_id=rollout_id, request_id=rollout_id,
        task_id=task_id, group_id=group_id, rollout_index=0, status=status, finish_reason=origin,
        num_steps=len(steps), max_steps=len(steps), step_policy_versions=versions, mode=EXPERIENCE_MODE,
        origin=origin, env_worker=PRODUCER, slot=0, reset_s=0.0, env_s=0.0, policy_wait_s=0.0, eval_s=0.0,
        started_at=at_ms))
    events.append(RewardAssigned(
        event_id=_id(rollout_id, "reward"), event_time=at_ms, **env, rollout_id=rollout_id, task_id=task_id,
        group_id=group_id, reward=reward, evaluator=PRODUCER, evaluator_version="1"))
    return events


def samples_as_experience(samples: Sequence[Sample], *, decode: Callable[[list[int]], str], run_id: str,
                          origin: str, at_ms: int) -> tuple[list[Event], int]:
    """The events of training samples' trajectories (one per ``rollout_id``, steps in order) as
    experience of ``origin``, each a success: how `dart up` puts the oracle's solutions in the
    pool; ``decode`` turns response tokens into their text. Returns (events, trajectories)."""
    by_rollout: dict[str, list[Sample]] = {}
    for sample in samples:
        by_rollout.setdefault(sample.rollout_id, []).append(sample)
    events: list[Event] = []
    for steps in by_rollout.values():
        first = steps[0]
        record = {
            "task_id": first.task_id, "instruction": first.context.instruction, "reward": 1.0,
            "screen_width": first.context.screen_width, "screen_height": first.context.screen_height,
            "steps": [{"screenshot_digest": s.context.screenshot_digest,
                       "response_text": decode(list(s.response_token_ids)),
                       "response_token_ids": list(s.response_token_ids), "prompt_hash": s.prompt_hash,
                       "policy_version": 0} for s in steps],
        }
        events += experience_events(record, run_id=run_id, origin=origin, at_ms=at_ms,
                                    digest_of=lambda step: step["screenshot_digest"])
    return events, len(by_rollout)


def load_experience(path: Path, *, run_id: str, origin: str = "experience",
                    put_file: Callable[[Path], str] | None = None, at_ms: int | None = None) -> list[Event]:
    """Events of every trajectory in a JSON-lines file; screenshots given as files go to ``put_file``."""
    base = path.parent

    def digest_of(step: dict[str, Any]) -> str:
        if step.get("screenshot_digest"):
            return str(step["screenshot_digest"])
        if step.get("screenshot") and put_file is not None:
            return put_file(base / str(step["screenshot"]))
        raise ValueError("each step needs screenshot_digest, or screenshot (a file) and a blob store")

    at = at_ms if at_ms is not None else int(time.time() * 1000)
    events: list[Event] = []
    for n, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            if not isinstance(record, dict):
                raise ValueError("a line must hold a JSON object")
            events += experience_events(record, run_id=run_id, origin=origin, at_ms=at, digest_of=digest_of)
        except (ValueError, TypeError) as exc:
            raise ValueError(f"line {n}: {exc}") from exc
    return events
