"""The inference-engine interface every backend implements, and its pure sampling maths.

An engine turns one prompt (chat messages + screenshots, from ``dart.agent.prompt``) and
sampling parameters into one response: text, token ids, per-token log-probs and entropies,
a finish reason, and the policy version that produced it.

Log-probs and entropies are those of the policy's own distribution: softmax of the raw
logits of the forward pass that sampled the token (temperature 1, no top-p truncation).
That is what a plain re-scoring forward pass computes (``dart.agent.model.score_response``),
so the trainer's ``logπ_old`` and the rollout ``logπ_rollout`` compare like for like.
Temperature, top-p and frequency penalty shape only which token is drawn.

Weight versions: ``swap_weights`` installs a new version *between* forward passes; requests
already running finish on the version they started with and report the newest version seen
meanwhile in ``Generation.newer_version_seen``.

``GenerateRequest`` and ``Generation`` are the agent core's (:mod:`dart.agent.decide`: what one
policy step asks of an engine); they are named here too for the engines.
"""

from __future__ import annotations

import abc
import asyncio
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from dart.agent.decide import GenerateRequest as GenerateRequest  # re-exported for the engines
from dart.agent.decide import Generation as Generation
from dart.errors import DartError
from dart.events import Sampling

if TYPE_CHECKING:
    import torch


class EngineError(DartError, RuntimeError):
    """An engine could not answer a request (server down, bad reply, unsupported operation)."""


class TransientEngineError(EngineError):
    """A failure worth retrying (timeout, connection reset, HTTP 429/5xx)."""


@dataclass(frozen=True, kw_only=True)
class EngineStats:
    requests: int
    batches: int
    busy_s: float
    """Seconds the engine spent running forward passes (busy fraction = busy_s / wall time)."""


class Engine(abc.ABC):
    """Answers prompts; safe to call ``generate`` concurrently from one event loop."""

    name: str = "engine"

    @property
    @abc.abstractmethod
    def version(self) -> int:
        """Weight version new requests will use."""

    @abc.abstractmethod
    async def generate(self, request: GenerateRequest) -> Generation:
        """Answer one prompt; raises EngineError (TransientEngineError when worth a retry)."""

    async def swap_weights(self, version: int, state: dict[str, Any]) -> float:
        """Install ``state`` (a full HF state_dict) as ``version`` between forward passes.

        Returns the swap latency in seconds (wait for the running batch excluded). Raises
        EngineError when the engine cannot swap (remote servers manage their own weights).
        """
        raise EngineError(f"the {self.name} engine cannot load weights in place")

    _newest_seen: int = -1

    def note_version_seen(self, version: int) -> None:
        """Tell the engine a newer version exists (requests running now will report it)."""
        self._newest_seen = max(self._newest_seen, version)

    def forget_versions_seen(self) -> None:
        """A version heard of was refused: stop reporting it as newer."""
        self._newest_seen = self.version

    def newer_version_than(self, used: int) -> int | None:
        """The newest version heard of, when newer than ``used``."""
        return self._newest_seen if self._newest_seen > used else None

    def stats(self) -> EngineStats:
        return EngineStats(requests=0, batches=0, busy_s=0.0)

    async def start(self) -> None:  # noqa: B027 - optional hook
        """Start background work (batchers, sessions); idempotent."""

    async def close(self) -> None:  # noqa: B027 - optional hook
        """Stop background work and release resources."""


@dataclass
class Pending:
    """A request waiting for a batching engine's next batch."""

    request: GenerateRequest
    future: asyncio.Future[Generation]
    queued_at: float = field(default_factory=time.perf_counter)


def deliver(batch: list[Pending], results: list[dict[str, Any] | BaseException], *, version: int,
            newer: int | None, started: float, busy_s: float) -> int:
    """Resolve each request of one batch run on ``version``: its Generation, or the error of its
    row; a request whose caller has gone (future done) is skipped. Returns the requests answered."""
    answered = 0
    for pending, result in zip(batch, results, strict=True):
        if pending.future.done():
            continue
        if isinstance(result, BaseException):
            pending.future.set_exception(result)
            continue
        answered += 1
        pending.future.set_result(Generation(
            **result, policy_version=version, newer_version_seen=newer,
            queue_s=started - pending.queued_at, generate_s=busy_s,
        ))
    return answered


# ---------------------------------------------------------------- pure maths


def apply_frequency_penalty(logits_V: torch.Tensor, generated: list[int], penalty: float) -> torch.Tensor:
    """OpenAI frequency penalty: subtract ``penalty * count(token)`` over the response so far."""
    import torch

    if penalty == 0.0 or not generated:
        return logits_V
    counts = torch.bincount(torch.tensor(generated, device=logits_V.device), minlength=logits_V.shape[-1])
    return logits_V - penalty * counts[: logits_V.shape[-1]].to(logits_V.dtype)


def sampling_probs(logits_V: torch.Tensor, temperature: float, top_p: float) -> torch.Tensor:
    """The distribution a token is drawn from: softmax(logits / T) cut to the top-p nucleus
    (the smallest set of most likely tokens whose mass reaches top_p), renormalised."""
    import torch

    probs = torch.softmax(logits_V.float() / max(temperature, 1e-6), dim=-1)
    if top_p < 1.0:
        sorted_p, order = probs.sort(descending=True)
        # Keep a token when the mass strictly before it is < top_p, so the first always stays.
        keep = (sorted_p.cumsum(-1) - sorted_p) < top_p
        mask = torch.zeros_like(probs, dtype=torch.bool).scatter(-1, order, keep)
        probs = torch.where(mask, probs, torch.zeros_like(probs))
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


def draw_token(
    logits_V: torch.Tensor, sampling: Sampling, generated: list[int], generator: torch.Generator | None
) -> int:
    """One token under ``sampling`` (temperature 0 = greedy), with its own RNG."""
    import torch

    logits_V = apply_frequency_penalty(logits_V.float(), generated, sampling.frequency_penalty)
    if sampling.temperature <= 0.0:
        return int(logits_V.argmax())
    probs = sampling_probs(logits_V, sampling.temperature, sampling.top_p)
    return int(torch.multinomial(probs, 1, generator=generator))


def token_logprobs_entropies(logits_T_V: torch.Tensor, tokens: list[int]) -> tuple[list[float], list[float]]:
    """Log-prob of each token and entropy (nats) of each row of raw logits."""
    import torch

    logp_T_V = torch.log_softmax(logits_T_V.float(), dim=-1)
    idx = torch.tensor(tokens, device=logp_T_V.device, dtype=torch.long).unsqueeze(-1)
    logprobs = logp_T_V.gather(-1, idx).squeeze(-1)
    entropies = -(logp_T_V.exp() * logp_T_V).nan_to_num(0.0).sum(-1)
    return logprobs.tolist(), entropies.tolist()


def entropy_from_top_logprobs(top: list[float]) -> float:
    """Lower bound of a token's entropy from its top-k log-probs: the leftover mass counts as
    one more outcome (exact when k covers the support)."""
    import math

    probs = [math.exp(lp) for lp in top if lp > -math.inf]
    rest = max(0.0, 1.0 - sum(probs))
    return -sum(p * math.log(p) for p in [*probs, rest] if p > 0.0)
