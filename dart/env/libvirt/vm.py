"""One pooled VM's record, what a backend holds while it uses one, and readiness probes."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from dart.env.libvirt.agent_client import AgentClient
from dart.env.libvirt.policy import Timings, VmState, VmStats


@dataclass(frozen=True, kw_only=True, slots=True)
class VmInfo:
    """What a probe may know about a VM."""

    name: str
    slot: int
    generation: int
    vm_dir: Path
    agent_url: str | None
    agent_token: str | None = field(default=None, repr=False)
    """What the guest agent wants in ``X-Dart-Agent-Token``."""


class Prober(Protocol):
    """Is this guest ready for work? One short check; the pool repeats it until a deadline."""

    async def ready(self, vm: VmInfo, *, timeout_s: float) -> bool: ...


class AgentProber:
    """Ready when the guest agent answers ``/screen_size`` (both dart's agent and OSWorld's do)."""

    async def ready(self, vm: VmInfo, *, timeout_s: float) -> bool:
        if not vm.agent_url:
            return False
        client = AgentClient(vm.agent_url, token=vm.agent_token, timeout_s=timeout_s)
        try:
            return await client.probe(timeout_s=timeout_s)
        finally:
            await client.close()


@dataclass(kw_only=True, slots=True)
class PooledVm:
    """The pool's mutable record of one domain (owned by :class:`VmPool`; backends get a lease)."""

    name: str
    slot: int
    generation: int
    vm_dir: Path
    disk: Path | None
    agent_url: str | None
    agent_token: str | None = field(default=None, repr=False)
    """This build's guest-agent token (a fresh one per build; see ``VmPool._define``)."""
    state: VmState = VmState.BUILDING
    dom: Any = None
    client: AgentClient | None = None
    stats: VmStats = field(default_factory=VmStats)
    timings: Timings = field(default_factory=Timings)
    health: str = "starting"
    created_at: float = field(default_factory=time.monotonic)
    state_since: float = field(default_factory=time.monotonic)
    busy_s: float = 0.0
    idle_s: float = 0.0

    def info(self) -> VmInfo:
        return VmInfo(name=self.name, slot=self.slot, generation=self.generation, vm_dir=self.vm_dir,
                      agent_url=self.agent_url, agent_token=self.agent_token)

    def set_state(self, state: VmState, now: float) -> None:
        """Move to ``state``, adding the time spent in the old one to busy or idle seconds."""
        spent = max(0.0, now - self.state_since)
        if self.state == VmState.BUSY:
            self.busy_s += spent
        elif self.state == VmState.READY:
            self.idle_s += spent
        self.state, self.state_since = state, now


@dataclass(frozen=True, kw_only=True, slots=True)
class VmLease:
    """A VM lent to one env slot until it is released back to the pool."""

    name: str
    slot: int
    agent: AgentClient
    """The guest agent of this VM (screenshots, actions, files, commands)."""
    token: int
    """Which build of the VM this lease is for; a lease outlived by a rebuild is refused."""
