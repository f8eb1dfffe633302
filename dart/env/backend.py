"""The one async interface every environment backend implements.

An env worker drives a backend through whole trajectories:
``reset(task)`` -> observation, ``step(action)`` -> observation ..., ``evaluate`` -> score,
``health()`` between trajectories, ``close()`` at the end. Evaluators reach into the
environment only through :class:`EnvAccess` (read a file, run a command as an argv list),
so the same metric code scores a synthetic screen, a local X desktop or a VM.

Any exception a backend raises is an infrastructure failure: the env worker ends the
trajectory as ``infra_error`` and re-queues it; it is never turned into a reward.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from dart.agent.actions import Action

if TYPE_CHECKING:
    from dart.env.tasks import Task


@dataclass(frozen=True, kw_only=True, slots=True)
class Observation:
    """What the agent sees after a reset or a step.

    Why a shape of its own: it is the backend's answer, with the screenshot's bytes; the episode
    puts them into the blob store and the step goes on as a :class:`PromptContext` by digest."""

    screenshot_png: bytes
    width: int
    height: int
    info: dict[str, Any] = field(default_factory=dict)
    """Backend facts worth logging (window title, timings); never shown to the policy."""


@dataclass(frozen=True, kw_only=True, slots=True)
class CommandResult:
    returncode: int
    stdout: str
    stderr: str = ""


@dataclass(frozen=True, kw_only=True, slots=True)
class Health:
    ok: bool
    detail: str = "ok"


class EnvAccess(Protocol):
    """What getters may do inside an environment (OSWorld's vm_file / vm_command_line)."""

    async def read_file(self, path: str) -> bytes:
        """Bytes of a file inside the environment; FileNotFoundError if it is not there."""
        ...

    async def run_command(self, argv: list[str], *, timeout_s: float = 30.0) -> CommandResult:
        """Run a program (argv list, never a shell string) inside the environment."""
        ...


class EnvBackend(ABC):
    """One environment slot."""

    name: str = "backend"

    @abstractmethod
    async def reset(self, task: Task) -> Observation:
        """Bring the environment to the task's start state (run its setup steps)."""

    @abstractmethod
    async def step(self, action: Action) -> Observation:
        """Execute one typed action and return the next observation."""

    @abstractmethod
    async def evaluate(self, task: Task, *, final_action: Action | None) -> tuple[float, dict[str, Any]]:
        """Score in [0, 1] and per-metric details. ``final_action`` is the agent's last action
        (an infeasible task scores 1 only if that is CallUser)."""

    @abstractmethod
    async def health(self) -> Health:
        """A cheap probe between trajectories."""

    @abstractmethod
    async def close(self) -> None:
        """Release everything (processes, displays, VMs)."""

    # EnvAccess, for evaluators and setup steps
    @abstractmethod
    async def read_file(self, path: str) -> bytes: ...

    @abstractmethod
    async def run_command(self, argv: list[str], *, timeout_s: float = 30.0) -> CommandResult: ...
