"""The ``openai`` engine: any OpenAI-compatible chat-completions server (vLLM, SGLang, ``dart serve``).

Screenshots travel as PNG data URLs. Every request asks for log-probs (``logprobs``,
``top_logprobs``) and token ids (vLLM's ``return_token_ids``; ``dart serve`` answers it too).
Entropies come from the server when it reports them per token (``dart serve`` does, as
``entropy`` beside each log-prob); otherwise they are estimated from the top-k log-probs
(a lower bound, see ``entropy_from_top_logprobs``).

Each attempt has a bounded timeout; timeouts, connection errors and HTTP 408/429/5xx are
retried with exponential backoff, anything else (a 400 for a bad request, a malformed body)
fails at once. The server owns its weights: this engine cannot swap them, and reports the
server's ``dart_policy_version`` when present, else ``policy_version`` from its config.
"""

from __future__ import annotations

import asyncio
import base64
import io
import logging
import os
import random
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dart.config import require
from dart.rollout.engine import (
    Engine,
    EngineError,
    EngineStats,
    GenerateRequest,
    Generation,
    TransientEngineError,
    entropy_from_top_logprobs,
)

if TYPE_CHECKING:
    import aiohttp
    from PIL import Image

log = logging.getLogger(__name__)

TRANSIENT_STATUS = frozenset({408, 429, 500, 502, 503, 504})


@dataclass(frozen=True, kw_only=True)
class OpenAIEngineConfig:
    base_url: str = "http://127.0.0.1:8000/v1"
    """Server root including /v1."""
    model: str = "policy"
    """Model name the server serves."""
    api_key_env: str = "OPENAI_API_KEY"
    """Environment variable holding the API key (keys never live in config files); unset = no key."""
    timeout_s: float = 120.0
    """Limit of one attempt (connect + generate + read)."""
    max_retries: int = 3
    """Retries after the first attempt, on transient errors only."""
    backoff_s: float = 0.5
    """First retry delay; doubles each retry, with +-25 % jitter."""
    top_logprobs: int = 5
    """Alternatives asked per token (entropy estimate when the server does not report it)."""
    policy_version: int = 0
    """Version stamped on answers when the server does not say (dart_policy_version)."""

    def __post_init__(self) -> None:
        require(
            self.base_url.startswith(("http://", "https://")),
            "base_url",
            f"not an http URL: {self.base_url!r}",
        )
        require(self.timeout_s > 0, "timeout_s", f"must be > 0, got {self.timeout_s}")
        require(self.max_retries >= 0, "max_retries", f"must be >= 0, got {self.max_retries}")
        require(0 <= self.top_logprobs <= 20, "top_logprobs", f"must be in [0, 20], got {self.top_logprobs}")


def image_data_url(image: Image.Image) -> str:
    buf = io.BytesIO()
    image.save(buf, "PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def to_openai_messages(messages: list[dict[str, Any]], images: list[Image.Image]) -> list[dict[str, Any]]:
    """``build_messages`` output in OpenAI form: each ``{"type": "image"}`` item becomes an
    ``image_url`` item carrying the next image as a PNG data URL."""
    it = iter(images)
    out = []
    for m in messages:
        content = m["content"]
        if isinstance(content, list):
            content = [
                {"type": "image_url", "image_url": {"url": image_data_url(next(it))}}
                if c.get("type") == "image"
                else c
                for c in content
            ]
        out.append({"role": m["role"], "content": content})
    return out


def parse_choice(body: dict[str, Any], *, fallback_version: int) -> dict[str, Any]:
    """Generation fields from a chat-completions response body; EngineError when malformed."""
    try:
        choice = body["choices"][0]
        text = choice["message"].get("content") or ""
        content = ((choice.get("logprobs") or {}).get("content")) or []
        logprobs = [float(c["logprob"]) for c in content]
        entropies = [
            float(c["entropy"])
            if "entropy" in c
            else entropy_from_top_logprobs([t["logprob"] for t in c.get("top_logprobs") or []])
            for c in content
        ]
        token_ids = choice.get("token_ids")
        if token_ids is None:  # vLLM --return-tokens-as-token-ids writes "token_id:123"
            token_ids = [
                int(c["token"].split(":", 1)[1])
                for c in content
                if str(c.get("token", "")).startswith("token_id:")
            ]
        token_ids = [int(t) for t in token_ids]
        prompt_ids = body.get("prompt_token_ids") or choice.get("prompt_token_ids")
        version = body.get("dart_policy_version")
        return {
            "text": text,
            "token_ids": token_ids,
            "logprobs": logprobs,
            "entropies": entropies,
            "finish_reason": choice.get("finish_reason") or "stop",
            "prompt_token_ids": [int(t) for t in prompt_ids] if prompt_ids is not None else None,
            "policy_version": int(version) if version is not None else fallback_version,
            "newer_version_seen": body.get("dart_newer_version_seen"),
        }
    except (KeyError, IndexError, TypeError, ValueError, AttributeError) as exc:
        raise EngineError(f"malformed chat-completions response: {exc!r}") from exc


class OpenAIEngine(Engine):
    name = "openai"

    def __init__(self, cfg: OpenAIEngineConfig | None = None) -> None:
        self.cfg = cfg or OpenAIEngineConfig()
        self._session: aiohttp.ClientSession | None = None
        self._requests = 0
        self._in_flight = 0
        self._busy_s = 0.0
        self._busy_since = 0.0

    def stats(self) -> EngineStats:
        """busy_s: wall seconds with at least one request waiting on the server (the server's
        own forward passes are not visible from here)."""
        busy = self._busy_s + (time.perf_counter() - self._busy_since if self._in_flight else 0.0)
        return EngineStats(requests=self._requests, batches=self._requests, busy_s=busy)

    @property
    def version(self) -> int:
        return self.cfg.policy_version

    async def start(self) -> None:
        import aiohttp

        if self._session is None:
            key = os.environ.get(self.cfg.api_key_env, "")
            headers = {"Authorization": f"Bearer {key}"} if key else {}
            self._session = aiohttp.ClientSession(
                headers=headers, timeout=aiohttp.ClientTimeout(total=self.cfg.timeout_s)
            )

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def body(self, request: GenerateRequest) -> dict[str, Any]:
        s = request.sampling
        return {
            "model": self.cfg.model,
            "messages": to_openai_messages(request.messages, request.images),
            "temperature": s.temperature,
            "top_p": s.top_p,
            "max_tokens": s.max_new_tokens,
            "seed": s.seed,
            "frequency_penalty": s.frequency_penalty,
            "logprobs": True,
            "top_logprobs": self.cfg.top_logprobs,
            "return_token_ids": True,
            "skip_special_tokens": True,
        }

    async def generate(self, request: GenerateRequest) -> Generation:
        await self.start()
        body = self.body(request)
        started = time.perf_counter()
        if self._in_flight == 0:
            self._busy_since = started
        self._in_flight += 1
        try:
            result = await self._post_with_retries(body)
        finally:
            self._in_flight -= 1
            if self._in_flight == 0:
                self._busy_s += time.perf_counter() - self._busy_since
        self._requests += 1
        return Generation(**result, queue_s=0.0, generate_s=time.perf_counter() - started)

    async def _post_with_retries(self, body: dict[str, Any]) -> dict[str, Any]:
        delay = self.cfg.backoff_s
        for attempt in range(self.cfg.max_retries + 1):
            try:
                return await self._post(body)
            except TransientEngineError as exc:
                if attempt == self.cfg.max_retries:
                    raise EngineError(
                        f"{self.cfg.base_url}: gave up after {attempt + 1} attempts: {exc}"
                    ) from exc
                log.warning(
                    "openai engine: %s; retry %d/%d in %.2f s", exc, attempt + 1, self.cfg.max_retries, delay
                )
                await asyncio.sleep(delay * random.uniform(0.75, 1.25))
                delay *= 2
        raise AssertionError("unreachable: the last attempt returns or raises")

    async def _post(self, body: dict[str, Any]) -> dict[str, Any]:
        import aiohttp

        assert self._session is not None
        url = self.cfg.base_url.rstrip("/") + "/chat/completions"
        try:
            async with self._session.post(url, json=body) as resp:
                if resp.status in TRANSIENT_STATUS:
                    raise TransientEngineError(f"HTTP {resp.status} from {url}: {(await resp.text())[:200]}")
                if resp.status != 200:
                    raise EngineError(f"HTTP {resp.status} from {url}: {(await resp.text())[:500]}")
                payload = await resp.json(content_type=None)
        except (TimeoutError, aiohttp.ClientConnectionError, aiohttp.ServerTimeoutError) as exc:
            raise TransientEngineError(f"{url}: {type(exc).__name__}: {exc}") from exc
        except aiohttp.ClientError as exc:
            raise EngineError(f"{url}: {type(exc).__name__}: {exc}") from exc
        except ValueError as exc:  # body is not JSON
            raise EngineError(f"{url}: response is not JSON: {exc}") from exc
        return parse_choice(payload, fallback_version=self.cfg.policy_version)
