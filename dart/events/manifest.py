"""Training batch manifests: what the data manager hands the trainer, through the blob store.

A manifest is a JSON blob (claim-check pattern: the ``BatchAssembled`` event carries only its
digest). Each sample is one assistant turn of one trajectory (step-wise GRPO) with everything
the trainer needs to rebuild that turn's exact prompt and weigh its tokens. Shared kernel:
the data manager writes it, the trainer reads it, neither imports the other.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Self

from dart.errors import DecodeError
from dart.events.types import HistoryTurn, ObservationEmitted

MANIFEST_FORMAT = "dart.batch.v1"


@dataclass(frozen=True, kw_only=True, slots=True)
class PromptContext:
    """What the prompt builder needs for one step: the observation minus its routing.

    Why a shape of its own: the prompt is built from it wherever the step came from (an episode in
    this process, an ``ObservationEmitted`` off the log, a projection row, a manifest), so the
    prompt builder never sees routing or the bus."""

    instruction: str
    step_index: int
    screenshot_digest: str
    screen_width: int
    screen_height: int
    history: list[HistoryTurn] = field(default_factory=list)
    """Every earlier turn, oldest first; the prompt builder applies its own window."""

    @classmethod
    def from_observation(cls, obs: ObservationEmitted) -> Self:
        return cls(
            instruction=obs.instruction,
            step_index=obs.step_index,
            screenshot_digest=obs.screenshot_digest,
            screen_width=obs.screen_width,
            screen_height=obs.screen_height,
            history=list(obs.history),
        )

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Self:
        return cls(**{**d, "history": [HistoryTurn(**h) for h in d.get("history", [])]})


def step_contexts(instruction: str, screen: tuple[int, int], turns: Sequence[tuple[str, str]]) -> list[PromptContext]:
    """The prompt context of each step of a trajectory whose turns were (screenshot digest,
    response text): step i's history is turns 0..i-1. The one step-history builder of the
    trajectories dart writes itself (oracle demonstrations, imported experience)."""
    history = [HistoryTurn(step_index=i, screenshot_digest=digest, response_text=text)
               for i, (digest, text) in enumerate(turns)]
    return [PromptContext(instruction=instruction, step_index=i, screenshot_digest=digest, screen_width=screen[0],
                          screen_height=screen[1], history=history[:i])
            for i, (digest, _) in enumerate(turns)]


@dataclass(frozen=True, kw_only=True, slots=True)
class Sample:
    """One step of one trajectory: as the projection reads it back, as curation batches it, and as
    the trainer receives it.

    Why a shape of its own: it is the step as the data manager holds it (the observation joined with
    the action that answered it) and the unit of a batch manifest, which crosses to the trainer as
    JSON in the blob store. Before curation a step is ``origin="online"`` with reward 0;
    :func:`dart.data.batcher.build_manifest` sets what curation decided (group, reward, origin,
    sft). Field names follow the log's (``ActionChosen``) except ``rollout_logprobs``, the manifest's
    name, which tells the sampler's log-probs from the trainer's own."""

    rollout_id: str
    step_index: int
    task_id: str
    group_id: str
    context: PromptContext
    prompt_hash: str
    """sha256 of the prompt token ids the rollout worker used; the trainer must rebuild the same."""
    response_token_ids: list[int]
    rollout_logprobs: list[float]
    """Per-token log-probs under the sampler (``ActionChosen.logprobs``; for truncated importance
    sampling)."""
    entropies: list[float]
    mean_entropy: float = 0.0
    """Mean entropy of the response's tokens (the projection's ``actions.mean_entropy``); curation
    keeps the highest-entropy online steps by it. Manifests written before it existed read as 0."""
    policy_version: int
    reward: float = 0.0
    """Trajectory reward; every step of a trajectory shares it (set by curation). The trainer turns
    rewards into step-wise GRPO advantages with group statistics over trajectories (group_id,
    rollout_id)."""
    origin: str = "online"
    """online | experience (injected into an all-fail group) | oracle."""
    sft: bool = False
    """Also train this sample with the optional SFT term (strongly off-policy successes)."""

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Self:
        return cls(**{**d, "context": PromptContext.from_dict(d["context"])})


@dataclass(frozen=True, kw_only=True, slots=True)
class BatchManifest:
    batch_id: str
    seq: int
    run_id: str
    samples: list[Sample]
    stats: dict[str, float] = field(default_factory=dict)
    """Curation statistics of the batch (groups dropped, injected, entropy cut-off ...)."""

    def to_bytes(self) -> bytes:
        body = {"format": MANIFEST_FORMAT, **asdict(self)}
        return json.dumps(body, separators=(",", ":"), sort_keys=True).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> Self:
        try:
            body = json.loads(data)
            if body.pop("format", None) != MANIFEST_FORMAT:
                raise ValueError(f"format is not {MANIFEST_FORMAT}")
            return cls(
                batch_id=body["batch_id"],
                seq=int(body["seq"]),
                run_id=body["run_id"],
                samples=[Sample.from_dict(s) for s in body["samples"]],
                stats=body.get("stats", {}),
            )
        except (ValueError, KeyError, TypeError) as exc:
            raise DecodeError(f"not a batch manifest: {exc}") from exc
