"""The rollout worker end to end on the real broker with the tiny model."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from dart.agent.model import load_policy
from dart.agent.prompt import blob_image_loader, build_messages, encode_prompt, prompt_hash
from dart.agent.tiny import build_tiny
from dart.agent.weight_format import state_dict_to_bytes
from dart.bus import Producer, ReplyInbox, read_topic
from dart.events import ActionChosen, ObservationEmitted, Sampling, WeightsLoaded
from dart.events.manifest import PromptContext
from dart.rollout.hf_engine import HFEngine
from dart.rollout.service import RolloutWorker, RolloutWorkerConfig
from tests.agent.screens import SMALL, context
from tests.rollout.test_weight_swap import publish

pytestmark = pytest.mark.kafka


def observation(store, route, *, step: int = 1) -> ObservationEmitted:
    ctx = context(store, steps=step)
    return ObservationEmitted.new(
        run_id="t",
        producer="env-1",
        rollout_id="r1",
        request_id="q1",
        task_id="task",
        group_id="g",
        step_index=ctx.step_index,
        instruction=ctx.instruction,
        screenshot_digest=ctx.screenshot_digest,
        screen_width=ctx.screen_width,
        screen_height=ctx.screen_height,
        history=ctx.history,
        reply=route,
        sampling=Sampling(temperature=0.7, top_p=0.9, max_new_tokens=16, seed=uuid.uuid4().int & 0xFFFF),
        max_steps=10,
        env_worker="env-1",
        slot=0,
    )


async def ask(producer, inbox, bus, obs) -> ActionChosen:
    fut = inbox.expect(obs.event_id)
    await producer.send(obs, topic=bus.topics.observations, key=obs.rollout_id.encode())
    return await asyncio.wait_for(fut, 60)


async def test_observation_in_action_out_and_weight_swap(bus, tiny_dir, store, tmp_path):
    policy = load_policy(tiny_dir)
    cfg = RolloutWorkerConfig(model=str(tiny_dir), worker_id="rw-1", run_id="t", prompt=SMALL, heartbeat_s=60)
    worker = RolloutWorker(cfg, HFEngine(policy), store, bus)
    stop = asyncio.Event()
    running = asyncio.create_task(worker.run(stop))
    producer = Producer(bus, client_id="env-1")
    inbox = ReplyInbox(bus, "env-1", producer=producer)
    try:
        await inbox.start()
        await worker.ready(30)
        obs = observation(store, inbox.route)
        reply = await ask(producer, inbox, bus, obs)

        assert isinstance(reply, ActionChosen)
        assert reply.in_reply_to == obs.event_id and reply.rollout_id == "r1" and reply.step_index == 1
        assert reply.policy_version == 0 and reply.engine == "hf" and reply.producer == "rw-1"
        assert reply.finish_reason in ("stop", "length") and 0 < len(reply.response_token_ids) <= 16
        assert len(reply.logprobs) == len(reply.entropies) == len(reply.response_token_ids)
        assert reply.actions and all(a.kind for a in reply.actions)  # random weights: usually 'invalid'
        # the trainer rebuilds the same prompt from the observation's context
        ctx = PromptContext.from_observation(obs)
        inputs = encode_prompt(
            policy.tokenizer, policy.image_processor, *build_messages(ctx, blob_image_loader(store), SMALL)
        )
        assert (
            reply.prompt_hash == prompt_hash(inputs.token_ids()) and reply.prompt_tokens == inputs.num_tokens
        )

        # a new version on the weights topic: the worker swaps and says so on the heartbeats topic
        blob = state_dict_to_bytes(load_policy(build_tiny(tmp_path / "v1", seed=1)).model)
        await producer.send(publish(store, 1, blob), topic=bus.topics.weights)
        for _ in range(300):
            if worker.engine.version == 1:
                break
            await asyncio.sleep(0.05)
        loaded = [
            d.event
            async for d in read_topic(bus, bus.topics.heartbeats, idle_timeout_s=1.0)
            if isinstance(d.event, WeightsLoaded)
        ]
        assert [(e.worker_id, e.version, e.previous_version, e.ok) for e in loaded] == [("rw-1", 1, 0, True)]
        after = await ask(producer, inbox, bus, observation(store, inbox.route, step=2))
        assert after.policy_version == 1

        # a screenshot that is not in the blob store is an error reply, not a crash
        broken = ObservationEmitted(
            **{**_fields(observation(store, inbox.route)), "screenshot_digest": "0" * 64}
        )
        error = await ask(producer, inbox, bus, broken)
        assert error.finish_reason == "error" and error.actions[0].kind == "invalid"
        assert not running.done()
    finally:
        stop.set()
        await asyncio.wait_for(running, 30)
        await inbox.close()
        producer.close()


def _fields(event) -> dict:
    import dataclasses

    return {f.name: getattr(event, f.name) for f in dataclasses.fields(event)}
