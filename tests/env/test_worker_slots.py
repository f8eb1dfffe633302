"""Pure parts of the env worker: slot clock, statuses, and one episode
driven by scripted fakes of the bus (no broker)."""

from __future__ import annotations

import asyncio

import pytest

from dart.agent.actions import CallUser, Click, Finished, to_wire
from dart.blobs import LocalBlobStore
from dart.env.episode import Episode, ReplyTimeout, RolloutServiceActor, rollout_id_of
from dart.env.slots import SlotClock, next_attempt, trajectory_status, utilization
from dart.env.synthetic import SyntheticBackend, generate_tasks, oracle_plan
from dart.env.tasks import Task
from dart.events import ActionChosen, ParsedAction, ReplyRoute, RolloutRequested, Sampling, TrajectoryStatus


def test_slot_clock_counts_busy_and_idle_slot_seconds():
    c = SlotClock(slots=2, start=0.0)
    c.begin(0, 1.0)
    c.begin(1, 2.0)
    c.end(0, 5.0)
    assert c.busy_slots == 1
    busy, idle = c.totals(6.0)  # slot 0: 4 s, slot 1: 4 s so far; wall 12 slot-seconds
    assert (busy, idle) == (8.0, 4.0)
    assert utilization(busy, idle) == pytest.approx(8 / 12)
    with pytest.raises(ValueError):
        c.begin(1, 6.0)
    with pytest.raises(ValueError):
        c.end(0, 6.0)


def test_trajectory_status_and_attempts():
    assert trajectory_status(reward=1.0, ran_out=False, success_threshold=1.0) == TrajectoryStatus.SUCCESS
    assert trajectory_status(reward=0.5, ran_out=False, success_threshold=1.0) == TrajectoryStatus.FAIL
    assert trajectory_status(reward=0.5, ran_out=False, success_threshold=0.5) == TrajectoryStatus.SUCCESS
    assert trajectory_status(reward=1.0, ran_out=True, success_threshold=1.0) == TrajectoryStatus.TIMEOUT
    assert [next_attempt(a, 3) for a in range(3)] == [1, 2, None]
    assert next_attempt(0, 1) is None


# ---------------------------------------------------------------- one episode, scripted bus


class ScriptedInbox:
    """Answers each observation with the next scripted list of wire actions (None: hang)."""

    route = ReplyRoute(topic="t", partition=0, worker_id="w")

    def __init__(self, script):
        self.script = list(script)
        self.expected: list[str] = []

    def expect(self, cid):
        self.expected.append(cid)

    async def wait(self, cid, timeout_s):
        actions = self.script.pop(0) if self.script else None
        if actions is None:
            await asyncio.sleep(timeout_s)
            raise TimeoutError
        return ActionChosen.new(
            run_id="r", producer="p", in_reply_to=cid, rollout_id="x", request_id="x", task_id="x", step_index=0,
            response_text="...", actions=actions, response_token_ids=[], logprobs=[], entropies=[],
            policy_version=3, prompt_hash="", prompt_tokens=0, finish_reason="stop", engine="fake", queue_s=0.0,
            generate_s=0.0, sampling=SAMPLING,
        )


class RecordingProducer:
    def __init__(self):
        self.sent = []

    async def send(self, event, **kw):
        self.sent.append(event)


SAMPLING = Sampling(temperature=1.0, top_p=1.0, max_new_tokens=8, seed=1)


def _episode(task_dict, inbox, tmp_path, max_steps=5):
    req = RolloutRequested.new(run_id="r", producer="p", request_id="req", task_id=task_dict["id"], group_id="g",
                               rollout_index=0, group_size=1, max_steps=max_steps, attempt=2, sampling=SAMPLING)
    task = Task.from_dict(task_dict, domain="synthetic")
    ep = Episode(task=task, instruction=task.instruction, backend=SyntheticBackend(), max_steps=max_steps)
    producer = RecordingProducer()
    actor = RolloutServiceActor(req=req, slot=0, worker_id="w", run_id="r", producer=producer, inbox=inbox,
                                reply_timeout_s=0.2)
    return ep, producer, {"actor": actor, "store": LocalBlobStore(tmp_path / "b")}


def _check_then_ok():
    return next(t for t in generate_tasks(80, preset="tiny", seed=0) if t["instruction"].startswith("Check"))


async def test_episode_runs_several_actions_of_one_answer_in_order(tmp_path):
    task = _check_then_ok()
    both = [to_wire(a) for a in oracle_plan(task)]
    ep, producer, io = _episode(task, ScriptedInbox([both]), tmp_path)
    await ep.run(**io)
    assert (ep.num_steps, ep.finish_reason, ep.score) == (1, "env_done", 1.0)
    assert io["actor"].rollout_id == rollout_id_of(io["actor"].req) == "req.2"
    assert {e.rollout_id for e in producer.sent} == {"req.2"}
    assert [e.step_index for e in producer.sent] == [0]


async def test_episode_finished_and_call_user_end_the_trajectory(tmp_path):
    task = _check_then_ok()
    first = to_wire(oracle_plan(task)[0])
    ep, _, io = _episode(task, ScriptedInbox([[first], [to_wire(Finished(content="done"))]]), tmp_path)
    await ep.run(**io)
    assert (ep.num_steps, ep.finish_reason, ep.score) == (2, "finished", 0.0)  # OK never pressed
    assert isinstance(ep.final_action, Finished)
    ep, _, io = _episode(task, ScriptedInbox([[to_wire(CallUser())]]), tmp_path)
    await ep.run(**io)
    assert (ep.finish_reason, ep.score) == ("call_user", 0.0)  # a feasible task given up scores 0


async def test_episode_counts_invalid_steps_and_runs_out_of_steps(tmp_path):
    task = _check_then_ok()
    garbage = [ParsedAction(kind="invalid", text="nope")]
    nowhere = [to_wire(Click(x=0, y=0))]
    ep, producer, io = _episode(task, ScriptedInbox([garbage, [], nowhere]), tmp_path, max_steps=3)
    await ep.run(**io)
    assert (ep.num_steps, ep.invalid_steps, ep.ran_out) == (3, 2, True)
    assert [len(e.history) for e in producer.sent] == [0, 1, 2]
    assert ep.versions == [3, 3, 3]


async def test_episode_reply_timeout_keeps_its_progress(tmp_path):
    task = _check_then_ok()
    ep, _, io = _episode(task, ScriptedInbox([[to_wire(oracle_plan(task)[0])], None]), tmp_path)
    with pytest.raises(ReplyTimeout, match="no action for step 1"):
        await ep.run(**io)
    assert ep.num_steps == 1 and ep.policy_wait_s >= 0.2 and ep.score is None
