"""The synthetic backend: rendered GUI tasks with realistic latency and injected crashes.

The screen logic is the pure state machine of :mod:`dart.env.synthetic.screen`; this shell
adds what real environments have: step latency (``asyncio.sleep`` drawn from
:class:`LatencyConfig`) and crashes (with probability ``crash_p`` a reset or step raises
:class:`EnvError`, and the slot stays broken until it is recycled, like a dead VM).

The state is readable at ``/synthetic/state.json`` through :meth:`read_file`, which is how
the ``synthetic_state`` getter and the ``synthetic_state_match`` metric score a task.
"""

from __future__ import annotations

import asyncio
import json
import random
from dataclasses import dataclass, field
from typing import Any

from dart.agent.actions import Action
from dart.config import require
from dart.env.backend import CommandResult, EnvBackend, Health, Observation
from dart.env.synthetic.generator import STATE_PATH
from dart.env.synthetic.latency import LatencyConfig, sample_latency
from dart.env.synthetic.metrics import register
from dart.env.synthetic.oracle import screen_of
from dart.env.synthetic.render import render_png
from dart.env.synthetic.screen import Spec, State, apply, initial_state
from dart.env.tasks import Task
from dart.errors import EnvError


@dataclass(frozen=True, kw_only=True)
class SyntheticConfig:
    latency: LatencyConfig = field(default_factory=LatencyConfig)
    """Latency of one step (a reset takes latency.reset_factor steps)."""
    crash_p: float = 0.0
    """Probability that one reset or step crashes the slot (raises EnvError)."""
    seed: int | None = None
    """Seed of the latency and crash draws (slot i uses seed + i); None draws from the OS."""

    def __post_init__(self) -> None:
        require(0.0 <= self.crash_p <= 1.0, "crash_p", f"must be in [0, 1], got {self.crash_p}")


class SyntheticBackend(EnvBackend):
    """One synthetic environment slot."""

    name = "synthetic"

    def __init__(self, cfg: SyntheticConfig | None = None, *, slot: int = 0) -> None:
        self.cfg = cfg or SyntheticConfig()
        self.slot = slot
        self._rng = random.Random(None if self.cfg.seed is None else self.cfg.seed + slot)
        self._spec: Spec | None = None
        self._state: State | None = None
        self._broken: str | None = None
        self._closed = False
        self.resets = 0
        self.steps = 0

    @property
    def state(self) -> State:
        """The current state (a copy is not made: do not mutate)."""
        if self._state is None:
            raise EnvError("the synthetic env has not been reset")
        return self._state

    async def reset(self, task: Any) -> Observation:
        self._usable()
        await self._latency(self.cfg.latency.reset_factor)
        self._maybe_crash("reset")
        self._spec = screen_of(task)
        self._state = initial_state(self._spec)
        self.resets += 1
        return self._observe()

    async def step(self, action: Action) -> Observation:
        self._usable()
        if self._spec is None or self._state is None:
            raise EnvError("step() before reset() on the synthetic env")
        await self._latency(1.0)
        self._maybe_crash("step")
        self._state = apply(self._spec, self._state, action)
        self.steps += 1
        return self._observe()

    async def evaluate(self, task: Any, *, final_action: Action | None) -> tuple[float, dict[str, Any]]:
        # Deferred: loads numpy, needed only here.
        from dart.env.evaluators import evaluate_task

        register()
        self._usable()
        typed = task if isinstance(task, Task) else Task.from_dict(task, domain="synthetic")
        return await evaluate_task(typed, self, final_action=final_action)

    async def health(self) -> Health:
        if self._closed:
            return Health(ok=False, detail="closed")
        if self._broken:
            return Health(ok=False, detail=self._broken)
        return Health(ok=True)

    async def close(self) -> None:
        self._closed = True

    async def read_file(self, path: str) -> bytes:
        self._usable()
        if path == STATE_PATH and self._state is not None:
            return json.dumps(self._state, sort_keys=True).encode()
        raise FileNotFoundError(f"the synthetic env holds only {STATE_PATH} (after a reset), not {path!r}")

    async def run_command(self, argv: list[str], *, timeout_s: float = 30.0) -> CommandResult:
        self._usable()
        return CommandResult(returncode=127, stdout="", stderr="the synthetic env runs no programs")

    # ------------------------------------------------------------------ internals

    def _observe(self) -> Observation:
        assert self._spec is not None and self._state is not None
        return Observation(
            screenshot_png=render_png(self._spec, self._state),
            width=int(self._spec["width"]),
            height=int(self._spec["height"]),
            info={"done": self._state["done"], "page": self._state["page"], "steps": self._state["steps"]},
        )

    async def _latency(self, factor: float) -> None:
        delay = sample_latency(self.cfg.latency, self._rng) * factor
        if delay > 0:
            await asyncio.sleep(delay)

    def _maybe_crash(self, where: str) -> None:
        if self.cfg.crash_p > 0 and self._rng.random() < self.cfg.crash_p:
            self._broken = f"injected crash in {where} (crash_p={self.cfg.crash_p})"
            raise EnvError(f"synthetic slot {self.slot}: {self._broken}")

    def _usable(self) -> None:
        if self._closed:
            raise EnvError(f"synthetic slot {self.slot} is closed")
        if self._broken:
            raise EnvError(f"synthetic slot {self.slot} is broken ({self._broken}); recycle it")
