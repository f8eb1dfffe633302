"""The ``libvirt`` env backend: one env slot that borrows VMs from a shared :class:`VmPool`.

Each ``reset`` gives the previous trajectory's VM back with its outcome (the pool keeps,
recycles or quarantines it) unless :meth:`LibvirtBackend.release` already did, borrows a ready VM, reverts it to the clean snapshot, waits for
its agent, and runs the task's setup steps. If a VM fails to reset, the slot tries once more
on another VM before it reports an infra error.
"""

from __future__ import annotations

import asyncio
import logging
import struct
import time
from typing import TYPE_CHECKING, Any

from dart.agent.actions import Action, CallUser, Finished, InvalidAction, Wait
from dart.env.backend import CommandResult, EnvBackend, Health, Observation
from dart.env.evaluators import evaluate_task
from dart.env.libvirt import setup
from dart.env.libvirt.pool import VmPool
from dart.env.libvirt.vm import VmLease
from dart.errors import EnvError

if TYPE_CHECKING:
    from dart.env.tasks import Task

log = logging.getLogger(__name__)

RESET_ATTEMPTS = 2
"""VMs a reset tries before it gives up (a failing VM is recycled by the pool meanwhile)."""


class LibvirtBackend(EnvBackend):
    name = "libvirt"

    def __init__(self, pool: VmPool, *, acquire_timeout_s: float | None = None, wait_s: float = 1.0,
                 fetch: setup.Fetcher | None = None) -> None:
        """``wait_s``: how long a ``wait()`` action lets the guest run before the next screenshot."""
        self.pool = pool
        self.wait_s = wait_s
        self.acquire_timeout_s = acquire_timeout_s
        self._fetch = fetch
        self._lease: VmLease | None = None
        self._failed: str = ""

    @property
    def vm_name(self) -> str | None:
        return self._lease.name if self._lease else None

    async def release(self) -> None:
        """Give the VM back now, with this trajectory's outcome (the env worker calls it once a
        trajectory's results are sent, so an idle slot holds no VM); the next reset borrows one."""
        await self._give_back()

    async def _give_back(self) -> None:
        if self._lease is not None:
            lease, self._lease = self._lease, None
            try:
                await self.pool.release(lease, ok=not self._failed, error=self._failed)
            except EnvError as exc:  # the pool already rebuilt or replaced this VM
                log.warning("release of %s: %s", lease.name, exc)
        self._failed = ""

    def _agent(self) -> Any:
        if self._lease is None:
            raise EnvError("libvirt backend has no VM: call reset(task) first")
        return self._lease.agent

    async def _guard(self, what: str, coro: Any) -> Any:
        """Await ``coro``; an env failure marks this VM's trajectory failed (counted on release)."""
        try:
            return await coro
        except EnvError as exc:
            self._failed = self._failed or f"{what}: {exc}"  # the first failure is the cause
            raise

    async def reset(self, task: Task) -> Observation:
        await self._give_back()
        t0 = time.perf_counter()
        errors: list[str] = []
        for _attempt in range(RESET_ATTEMPTS):
            self._lease = await self.pool.acquire(timeout_s=self.acquire_timeout_s)
            try:
                timings = await self.pool.reset(self._lease)
                steps = await setup.run_steps(task.config, self._lease.agent, fetch=self._fetch)
                obs = await self._observe()
            except EnvError as exc:
                errors.append(f"{self._lease.name}: {exc}")
                self._failed = f"reset: {exc}"
                await self._give_back()
                continue
            info = {**obs.info, "vm": self._lease.name, "setup_steps": len(steps),
                    "reset_s": round(time.perf_counter() - t0, 4),
                    **{f"vm/{k}_s": round(v, 4) for k, v in timings.items()}}
            return Observation(screenshot_png=obs.screenshot_png, width=obs.width, height=obs.height, info=info)
        raise EnvError(f"reset of task {task.id} failed on {RESET_ATTEMPTS} VMs: " + " | ".join(errors))

    async def _observe(self) -> Observation:
        png = await self._agent().screenshot()
        width, height = png_size(png)
        return Observation(screenshot_png=png, width=width, height=height, info={})

    async def step(self, action: Action) -> Observation:
        if isinstance(action, Wait):
            await asyncio.sleep(self.wait_s)
        elif not isinstance(action, Finished | CallUser | InvalidAction):
            await self._guard(f"action {action.kind}", self._agent().act(action))
        return await self._guard("screenshot", self._observe())

    async def evaluate(self, task: Task, *, final_action: Action | None) -> tuple[float, dict[str, Any]]:
        await self._guard("postconfig", setup.run_steps(task.evaluator.postconfig, self._agent(), fetch=self._fetch))
        score, details = await self._guard("evaluate", evaluate_task(task, self, final_action=final_action))
        details["vm"] = self.vm_name
        return score, details

    async def health(self) -> Health:
        if self._lease is None:
            ready = self.pool.ready_names()
            return Health(ok=bool(ready), detail=f"{len(ready)} VMs ready" if ready else "no VM ready")
        h = await self.pool.probe(self._lease)
        if not h.ok:
            self._failed = self._failed or f"health: {h.detail}"
        return h

    async def close(self) -> None:
        await self._give_back()

    async def read_file(self, path: str) -> bytes:
        return await self._guard("read_file", self._agent().read_file(path))

    async def run_command(self, argv: list[str], *, timeout_s: float = 30.0) -> CommandResult:
        return await self._guard("run_command", self._agent().execute(list(argv), timeout_s=timeout_s))


def png_size(png: bytes) -> tuple[int, int]:
    """Width and height from a PNG's IHDR chunk."""
    if len(png) < 24 or not png.startswith(b"\x89PNG\r\n\x1a\n") or png[12:16] != b"IHDR":
        raise EnvError(f"not a PNG screenshot ({len(png)} bytes)")
    width, height = struct.unpack(">II", png[16:24])
    return int(width), int(height)
