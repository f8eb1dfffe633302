"""The openai engine against ``dart serve`` over real HTTP on loopback."""

from __future__ import annotations

import asyncio

import pytest
from aiohttp import web

from dart.agent.model import score_response
from dart.agent.prompt import encode_prompt
from dart.rollout.engine import EngineError
from dart.rollout.hf_engine import HFEngine
from dart.rollout.openai_engine import OpenAIEngine, OpenAIEngineConfig
from dart.rollout.server import make_app, start_server
from tests.rollout.test_engines import request


async def test_openai_engine_against_dart_serve(policy, store):
    app = make_app(HFEngine(policy), model_name="tiny", tokenizer=policy.tokenizer)
    site, port = await start_server(app)
    engine = OpenAIEngine(
        OpenAIEngineConfig(base_url=f"http://127.0.0.1:{port}/v1", model="tiny", max_retries=0)
    )
    req = request(store, steps=1, max_new_tokens=12)
    try:
        gen = await engine.generate(req)
    finally:
        await engine.close()
        await site.stop()
    inputs = encode_prompt(policy.tokenizer, policy.image_processor, req.messages, req.images)
    # images went over the wire as PNG data URLs and came back as the same prompt
    assert gen.prompt_token_ids == inputs.token_ids()
    logprobs, entropies = score_response(policy.model, inputs, gen.token_ids)
    assert max(abs(a - b) for a, b in zip(logprobs, gen.logprobs, strict=True)) < 1e-4
    assert max(abs(a - b) for a, b in zip(entropies, gen.entropies, strict=True)) < 1e-4
    assert gen.policy_version == 0 and gen.finish_reason in ("stop", "length")
    # Its busy time (the rollout utilisation `dart up` shows) is the time a request waited on the server.
    stats = engine.stats()
    assert stats.requests == 1 and 0.0 < stats.busy_s <= gen.generate_s + 1e-3


async def test_openai_engine_retries_transient_errors_only(store):
    calls = {"flaky": 0, "bad": 0}

    async def flaky(request: web.Request) -> web.Response:
        calls["flaky"] += 1
        if calls["flaky"] < 3:
            return web.json_response({"error": "busy"}, status=503)
        return web.json_response(
            {
                "choices": [
                    {
                        "message": {"content": "Action: wait()"},
                        "finish_reason": "stop",
                        "token_ids": [5],
                        "logprobs": {"content": [{"token": "x", "logprob": -0.5, "top_logprobs": []}]},
                    }
                ]
            }
        )

    async def bad(request: web.Request) -> web.Response:
        calls["bad"] += 1
        return web.json_response({"error": "no"}, status=400)

    app = web.Application()
    app.router.add_post("/flaky/v1/chat/completions", flaky)
    app.router.add_post("/bad/v1/chat/completions", bad)
    site, port = await start_server(app)
    cfg = dict(max_retries=3, backoff_s=0.01, timeout_s=5)
    try:
        ok = await OpenAIEngine(
            OpenAIEngineConfig(base_url=f"http://127.0.0.1:{port}/flaky/v1", **cfg)
        ).generate(request(store))
        with pytest.raises(EngineError, match="HTTP 400"):
            await OpenAIEngine(
                OpenAIEngineConfig(base_url=f"http://127.0.0.1:{port}/bad/v1", **cfg)
            ).generate(request(store))
    finally:
        await site.stop()
    assert calls == {"flaky": 3, "bad": 1}
    assert ok.text == "Action: wait()" and ok.token_ids == [5] and ok.logprobs == [-0.5]


async def test_openai_engine_times_out_and_gives_up(store):
    async def slow(request: web.Request) -> web.Response:
        await asyncio.sleep(5)
        return web.json_response({})

    app = web.Application()
    app.router.add_post("/v1/chat/completions", slow)
    site, port = await start_server(app)
    engine = OpenAIEngine(
        OpenAIEngineConfig(
            base_url=f"http://127.0.0.1:{port}/v1", timeout_s=0.2, max_retries=1, backoff_s=0.01
        )
    )
    try:
        with pytest.raises(EngineError, match="gave up after 2 attempts"):
            await engine.generate(request(store))
    finally:
        await engine.close()
        await site.stop()


async def test_serve_rejects_remote_image_urls(policy):
    import aiohttp

    site, port = await start_server(make_app(HFEngine(policy)))
    body = {
        "messages": [
            {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://x/y.png"}}]}
        ]
    }
    try:
        async with (
            aiohttp.ClientSession() as s,
            s.post(f"http://127.0.0.1:{port}/v1/chat/completions", json=body) as r,
        ):
            status, payload = r.status, await r.json()
    finally:
        await site.stop()
    assert status == 400 and "data URLs" in payload["error"]["message"]
