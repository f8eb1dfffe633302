"""``dart serve``: any engine behind an OpenAI-compatible chat-completions endpoint.

``POST /v1/chat/completions`` takes OpenAI chat messages (text and ``image_url`` items; images
only as ``data:`` URLs — the server never fetches anything) and answers in the OpenAI shape
with vLLM's extensions: ``choices[0].token_ids``, top-level ``prompt_token_ids``, per-token
``logprobs.content[i]`` (``token``, ``logprob``, ``top_logprobs``) plus dart's own
``entropy`` beside each log-prob and ``dart_policy_version`` / ``dart_newer_version_seen``.
``GET /v1/models`` and ``GET /health`` answer too. Binds 127.0.0.1 by default, and serves
within the limits every dart HTTP server has (:mod:`dart.web.httplimits`): bounded connections,
half-sent heads and idle connections closed, a Host that is an address or localhost and no
foreign Origin (a web page renaming itself to this address gets a 403).

Images are bounded by pixels before they are decoded (``ImageLimits``): each image's declared
size is read from its header, and an image past the prompt's pixel budget, more images than a
prompt holds, or more pixels in all are refused with a 400 naming the limit; requests are parsed
on a worker thread, so the event loop keeps answering while an image decodes.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import io
import json
import logging
import time
import uuid
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from dart.agent.prompt import PromptConfig, decode_image
from dart.errors import DartError
from dart.events import Sampling
from dart.rollout.engine import Engine, EngineError, GenerateRequest, TransientEngineError
from dart.web.httplimits import ConnectionLimits, LimitedSite

log = logging.getLogger(__name__)


BODY_TIMEOUT_S = 15.0
"""A request's body (at most 64 MiB: a few screenshots as data URLs) must arrive within this: a
client that sends half a body holds its connection no longer (heads and idle connections are
bounded by ``dart.web.httplimits``)."""


class BadRequest(DartError, ValueError):
    """The request body is not a chat-completions request this server can answer."""


@dataclass(frozen=True, slots=True)
class ImageLimits:
    """What the images of one request may cost, checked on each image's declared size (its header)
    before it is decoded. The defaults are the prompt's own budget (``PromptConfig``): a larger
    screenshot is resized down to ``max_pixels`` anyway, and a prompt holds ``max_images``."""

    max_images: int = PromptConfig().max_images
    max_pixels: int = PromptConfig().max_pixels
    """Per image (width x height as declared)."""
    max_total_pixels: int = PromptConfig().max_images * PromptConfig().max_pixels


def declared_size(data: bytes) -> tuple[int, int]:
    """(width, height) an image's header declares, read without decoding its pixels."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(io.BytesIO(data)) as img:
            return img.size
    except (UnidentifiedImageError, OSError, ValueError) as exc:
        raise BadRequest(f"image is not a readable PNG/JPEG: {exc}") from exc


def parse_request(body: Any, limits: ImageLimits | None = None) -> GenerateRequest:
    """A GenerateRequest from a chat-completions body; BadRequest names what is wrong (images past
    ``limits`` included, refused before they are decoded)."""
    limits = limits or ImageLimits()
    total_pixels = 0
    if not isinstance(body, dict) or not isinstance(body.get("messages"), list) or not body["messages"]:
        raise BadRequest("body must be a JSON object with a non-empty 'messages' list")
    messages: list[dict[str, Any]] = []
    images = []
    for i, m in enumerate(body["messages"]):
        if not isinstance(m, dict) or m.get("role") not in ("system", "user", "assistant"):
            raise BadRequest(f"messages[{i}] needs a role of system, user or assistant")
        content = m.get("content")
        if isinstance(content, str):
            messages.append({"role": m["role"], "content": content})
            continue
        if not isinstance(content, list):
            raise BadRequest(f"messages[{i}].content must be a string or a list")
        items: list[dict[str, Any]] = []
        for item in content:
            kind = item.get("type") if isinstance(item, dict) else None
            if kind == "text":
                items.append({"type": "text", "text": str(item.get("text", ""))})
            elif kind == "image_url":
                if len(images) >= limits.max_images:
                    raise BadRequest(f"more than {limits.max_images} images in one request (ImageLimits.max_images: "
                                     "a prompt holds no more)")
                data = _data_url_bytes((item.get("image_url") or {}).get("url", ""))
                width, height = declared_size(data)
                if width * height > limits.max_pixels:
                    raise BadRequest(f"image {len(images)} declares {width}x{height} = {width * height} pixels, over "
                                     f"{limits.max_pixels} (ImageLimits.max_pixels, the prompt's pixel budget): send "
                                     "it resized")
                total_pixels += width * height
                if total_pixels > limits.max_total_pixels:
                    raise BadRequest(f"the images declare more than {limits.max_total_pixels} pixels in all "
                                     "(ImageLimits.max_total_pixels)")
                images.append(data)  # decoded once every image of the request has passed the limits
                items.append({"type": "image"})
            else:
                raise BadRequest(f"messages[{i}]: unsupported content item {kind!r}")
        messages.append({"role": m["role"], "content": items})
    try:
        max_tokens = int(body.get("max_completion_tokens") or body.get("max_tokens") or 256)
        sampling = Sampling(
            temperature=float(body.get("temperature", 1.0)),
            top_p=float(body.get("top_p", 1.0)),
            max_new_tokens=max_tokens,
            seed=int(body["seed"]) if body.get("seed") is not None else uuid.uuid4().int & 0x7FFF_FFFF,
            frequency_penalty=float(body.get("frequency_penalty", 0.0)),
        )
    except (TypeError, ValueError) as exc:
        raise BadRequest(f"bad sampling parameter: {exc}") from exc
    if not 1 <= max_tokens <= 32768 or sampling.temperature < 0 or not 0 < sampling.top_p <= 1:
        raise BadRequest("need 1 <= max_tokens <= 32768, temperature >= 0, 0 < top_p <= 1")
    return GenerateRequest(messages=messages, images=[decode_image(data) for data in images], sampling=sampling)


def _data_url_bytes(url: str) -> bytes:
    if not url.startswith("data:") or ";base64," not in url:
        raise BadRequest(
            "images must be base64 data URLs (data:image/png;base64,...); this server fetches nothing"
        )
    try:
        return base64.b64decode(url.split(";base64,", 1)[1], validate=True)
    except (binascii.Error, ValueError) as exc:
        raise BadRequest(f"image data URL is not valid base64: {exc}") from exc


def make_app(engine: Engine, *, model_name: str = "policy", tokenizer: Any = None,
             image_limits: ImageLimits | None = None) -> web.Application:
    """The aiohttp application; ``tokenizer`` (optional) names tokens in the log-prob list."""
    limits = image_limits or ImageLimits()

    def token_text(tid: int) -> str:
        return tokenizer.decode([tid]) if tokenizer is not None else f"token_id:{tid}"

    async def completions(request: web.Request) -> web.Response:
        try:
            raw = await asyncio.wait_for(request.read(), BODY_TIMEOUT_S)
        except TimeoutError:
            late = web.json_response({"error": {"message": f"the request body did not arrive within {BODY_TIMEOUT_S:g} s",
                                                "type": "invalid_request_error"}}, status=408)
            late.force_close()  # the rest of the body is not waited for either
            return late
        try:
            gen_request = await asyncio.to_thread(lambda: parse_request(json.loads(raw), limits))
        except (DartError, ValueError) as exc:
            return web.json_response(
                {"error": {"message": str(exc), "type": "invalid_request_error"}}, status=400
            )
        try:
            gen = await engine.generate(gen_request)
        except TransientEngineError as exc:
            return web.json_response({"error": {"message": str(exc), "type": "server_error"}}, status=503)
        except EngineError as exc:
            return web.json_response({"error": {"message": str(exc), "type": "server_error"}}, status=500)
        content = [
            {
                "token": token_text(t),
                "logprob": lp,
                "entropy": h,
                "top_logprobs": [{"token": token_text(t), "logprob": lp}],
            }
            for t, lp, h in zip(gen.token_ids, gen.logprobs, gen.entropies, strict=True)
        ]
        prompt_tokens = len(gen.prompt_token_ids or [])
        return web.json_response(
            {
                "id": f"chatcmpl-{uuid.uuid4().hex}",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": model_name,
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": gen.text},
                        "logprobs": {"content": content},
                        "finish_reason": gen.finish_reason,
                        "token_ids": gen.token_ids,
                    }
                ],
                "usage": {
                    "prompt_tokens": prompt_tokens,
                    "completion_tokens": len(gen.token_ids),
                    "total_tokens": prompt_tokens + len(gen.token_ids),
                },
                "prompt_token_ids": gen.prompt_token_ids,
                "dart_policy_version": gen.policy_version,
                "dart_newer_version_seen": gen.newer_version_seen,
            }
        )

    async def models(_: web.Request) -> web.Response:
        return web.json_response(
            {"object": "list", "data": [{"id": model_name, "object": "model", "owned_by": "dart"}]}
        )

    async def health(_: web.Request) -> web.Response:
        return web.json_response({"ok": True, "engine": engine.name, "policy_version": engine.version})

    async def on_startup(_: web.Application) -> None:
        await engine.start()

    async def on_cleanup(_: web.Application) -> None:
        await engine.close()

    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_post("/v1/chat/completions", completions)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/health", health)
    app.on_startup.append(on_startup)
    app.on_cleanup.append(on_cleanup)
    return app


async def start_server(app: web.Application, host: str = "127.0.0.1", port: int = 0,
                       limits: ConnectionLimits | None = None) -> tuple[LimitedSite, int]:
    """Serve ``app`` on host:port (0 = a free port) within ``limits``; returns the site (``stop()``
    it) and the bound port."""
    site = LimitedSite(limits or ConnectionLimits())
    bound = await site.serve(app, host, port)
    log.info("dart serve: http://%s:%d/v1 (at most %d connections)", host, bound, site.max_connections)
    return site, bound
