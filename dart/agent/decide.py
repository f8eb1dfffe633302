"""One policy step: prompt -> generate -> parse -> wire actions.

:func:`decide` is what answering one observation means, wherever the engine is: the rollout
worker calls it for every ``ObservationEmitted`` (and turns the :class:`Decision` into an
``ActionChosen``), and :class:`EngineActor` calls it for the one-process recipe's episodes
(warm-start checks, held-out evaluation, the one-process learner). The prompt is built from the
step's :class:`~dart.events.manifest.PromptContext` (screenshots from the blob store), the engine
answers, and the answer is parsed in the screen's pixels into typed actions, in wire form.

The request and response types of an engine live here too: the agent core names what a policy
step asks of an engine (:class:`Generator`), the rollout service's engines implement it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol

from dart.agent.actions import InvalidAction, to_wire
from dart.agent.prompt import PromptConfig, build_messages, prompt_hash
from dart.agent.uitars import parse_actions
from dart.events import ParsedAction, Sampling
from dart.events.manifest import PromptContext

if TYPE_CHECKING:
    from PIL import Image

    from dart.agent.prompt import Message

Convention = Literal["qwen25vl", "qwen2vl"]


@dataclass(frozen=True, kw_only=True)
class GenerateRequest:
    """One prompt to answer.

    Why a shape of its own: it is what an engine takes (chat + decoded images), built from a
    PromptContext by the agent or from an HTTP body by ``dart serve``; engines tokenise it."""

    messages: list[Message]
    """Chat from ``build_messages`` (``{"type": "image"}`` items refer to ``images`` in order)."""
    images: list[Image.Image]
    sampling: Sampling
    request_id: str = ""
    """Free-form id for logs (the observation's event_id in the service)."""


@dataclass(frozen=True, kw_only=True)
class Generation:
    """One response, as ``ActionChosen`` carries it.

    Why a shape of its own: it is what every engine returns, before anyone parses the text
    (``dart serve`` answers with it as it is). Its names are the engine's (``text``,
    ``token_ids``, as vLLM's completions and the HTTP answer have them); the rollout worker
    writes them into ``ActionChosen.response_text`` / ``response_token_ids``."""

    text: str
    """Decoded response without special tokens."""
    token_ids: list[int]
    """Sampled tokens, including the stop token when the response ended with one."""
    logprobs: list[float]
    """Per-token log-prob under the policy (raw logits, temperature 1), one per token id."""
    entropies: list[float]
    """Per-token entropy (nats) of the same distribution; approximate for remote servers that
    only return top-k log-probs (see OpenAIEngine)."""
    finish_reason: str
    """'stop' (a stop token was drawn) or 'length' (max_new_tokens reached)."""
    prompt_token_ids: list[int] | None
    """Token ids of the prompt as fed to the model; None when the engine cannot tell."""
    policy_version: int
    """Weight version that produced every token of this response."""
    newer_version_seen: int | None = None
    """A newer version the engine heard of while this request ran (it still used the old)."""
    queue_s: float = 0.0
    """Seconds between submission and the start of its forward passes."""
    generate_s: float = 0.0
    """Seconds of generation (its whole micro-batch)."""


class Generator(Protocol):
    """What a policy step needs of an engine (every ``dart.rollout.engine.Engine`` has it)."""

    async def generate(self, request: GenerateRequest) -> Generation: ...


@dataclass(frozen=True, kw_only=True)
class Decision:
    """The answer of one policy step.

    Why a shape of its own: it adds to the engine's :class:`Generation` what the agent decided
    from it (the parsed actions) and the prompt's hash; episodes in this process read it where the
    env worker reads an ``ActionChosen``."""

    generation: Generation
    actions: list[ParsedAction]
    """The parsed actions in wire form; never empty (an answer without one is an InvalidAction)."""
    prompt_hash: str
    """sha256 of the prompt token ids the engine used ('' when the engine cannot tell)."""
    prompt_s: float
    """Seconds building the prompt (reading screenshots included)."""

    @property
    def response_text(self) -> str:
        return self.generation.text

    @property
    def policy_version(self) -> int:
        return self.generation.policy_version


def wire_actions(text: str, *, screen: tuple[int, int], convention: Convention,
                 prompt: PromptConfig) -> list[ParsedAction]:
    """The actions of a model answer in wire form, in ``screen`` pixels; never raises, never empty."""
    actions = parse_actions(text, screen=screen, convention=convention, min_pixels=prompt.min_pixels,
                            max_pixels=prompt.max_pixels)
    return [to_wire(a) for a in actions] or [to_wire(InvalidAction(reason="no action in the answer", text=text))]


async def decide(ctx: PromptContext, engine: Generator, *, load_image: Callable[[str], Any], prompt: PromptConfig,
                 convention: Convention, sampling: Sampling, request_id: str = "") -> Decision:
    """One policy step for ``ctx``. Raises what reading a screenshot or the engine raises."""
    started = time.perf_counter()
    messages, images = await asyncio.to_thread(build_messages, ctx, load_image, prompt)
    built = time.perf_counter()
    gen = await engine.generate(GenerateRequest(messages=messages, images=images, sampling=sampling,
                                                request_id=request_id))
    return Decision(
        generation=gen,
        actions=wire_actions(gen.text, screen=(ctx.screen_width, ctx.screen_height), convention=convention,
                             prompt=prompt),
        prompt_hash=prompt_hash(gen.prompt_token_ids) if gen.prompt_token_ids is not None else "",
        prompt_s=built - started,
    )


class EngineActor:
    """An episode's actor in this process: every turn is one :func:`decide` on ``engine``, with
    ``sampling(step_index)``; :attr:`turns` keeps each turn's context and decision (what the
    one-process learner trains on)."""

    def __init__(self, engine: Generator, *, load_image: Callable[[str], Any], prompt: PromptConfig,
                 convention: Convention, sampling: Callable[[int], Sampling]) -> None:
        self.engine = engine
        self.load_image = load_image
        self.prompt = prompt
        self.convention: Convention = convention
        self.sampling = sampling
        self.turns: list[tuple[PromptContext, Decision]] = []

    async def act(self, ctx: PromptContext) -> Decision:
        decision = await decide(ctx, self.engine, load_image=self.load_image, prompt=self.prompt,
                                convention=self.convention, sampling=self.sampling(ctx.step_index))
        self.turns.append((ctx, decision))
        return decision
