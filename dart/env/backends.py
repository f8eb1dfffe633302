"""How an env worker gets its slots' backends, and what the slots share.

:class:`SlotBackends` makes one backend per slot (and a new one after an infra error: the
worker closes the slot's backend and asks for another) and owns whatever the slots share.
Synthetic and X-desktop slots share nothing. Libvirt slots share one :class:`VmPool` per
worker process (:class:`VmPoolBackends`): the worker starts it before it takes requests,
ticks it with every heartbeat (VM records on the heartbeats topic, idle VMs probed), hands
each finished trajectory's VM back to it, and closes it after the slots' backends. Replacing a broken VM is the pool's business (recycle,
quarantine); a new slot backend just borrows the next ready VM.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from dart.env.backend import EnvBackend
from dart.errors import EnvError
from dart.events import WorkerHeartbeat

if TYPE_CHECKING:
    from dart.env.config import EnvWorkerConfig
    from dart.env.libvirt import VmPool
    from dart.env.tasks import Task

log = logging.getLogger(__name__)

Publish = Callable[[WorkerHeartbeat], None]
"""Hands a heartbeat to the bus without waiting (called from pool callbacks, never blocks)."""


class SlotBackends:
    """Backends that stand alone (synthetic, xdesktop): start, tick and close do nothing."""

    def __init__(self, cfg: EnvWorkerConfig) -> None:
        self.cfg = cfg

    def make(self, slot: int) -> EnvBackend:
        """A fresh backend for slot ``slot`` (xdesktop starts its display on first reset)."""
        if self.cfg.backend == "xdesktop":
            # Deferred: loads aiohttp and Pillow, needed only here.
            from dart.env.xdesktop.backend import XDesktopBackend

            return XDesktopBackend(self.cfg.xdesktop, slot=slot)
        # Deferred: loads Pillow, needed only here.
        from dart.env.synthetic.backend import SyntheticBackend

        return SyntheticBackend(self.cfg.synthetic, slot=slot)

    def shipped_tasks(self) -> list[Task]:
        """Tasks that come with the backend (the local X desktop's own task files)."""
        if self.cfg.backend != "xdesktop":
            return []
        # Deferred: loads aiohttp and Pillow, needed only here.
        from dart.env.xdesktop.oracle import local_tasks

        return local_tasks()

    async def start(self) -> None:
        """Bring up what the slots share; the worker takes no request before this returns."""

    async def tick(self) -> None:
        """Called with every worker heartbeat."""

    async def finished(self, backend: EnvBackend) -> None:
        """Called once a trajectory on ``backend`` ended and its results were sent."""

    async def close(self) -> None:
        """Tear down what the slots share (after every slot's backend was closed)."""


class VmPoolBackends(SlotBackends):
    """Libvirt slots borrowing VMs from one pool of this worker process."""

    def __init__(self, cfg: EnvWorkerConfig, publish: Publish) -> None:
        # Deferred: loads libvirt and aiohttp, needed only here.
        from dart.env.libvirt import VmPool

        super().__init__(cfg)
        self.publish = publish
        self.pool: VmPool = VmPool(cfg.libvirt, on_heartbeat=publish, run_id=cfg.run_id, worker_id=cfg.worker)

    def make(self, slot: int) -> EnvBackend:
        # Deferred: loads libvirt and aiohttp, needed only here.
        from dart.env.libvirt import LibvirtBackend

        return LibvirtBackend(self.pool)

    async def finished(self, backend: EnvBackend) -> None:
        # Deferred: loads libvirt and aiohttp, needed only here.
        from dart.env.libvirt import LibvirtBackend

        # Between trajectories the VM is the pool's: idle probes cover it, and its heartbeats
        # count the slot's wait for the next request as VM idle time, not busy time.
        if isinstance(backend, LibvirtBackend):
            await backend.release()

    async def start(self) -> None:
        # Destroys the leftover domains of this pool's prefix (a crashed worker's), then boots
        # and snapshots every VM; raises EnvError if none came up.
        await self.pool.start()

    async def tick(self) -> None:
        for beat in self.pool.heartbeats():
            self.publish(beat)
        try:
            await self.pool.probe_idle()  # a sick idle VM is recycled before a slot borrows it
        except EnvError as exc:
            log.warning("idle VM probes failed: %s", exc)

    async def close(self) -> None:
        await self.pool.close()


def backends_for(cfg: EnvWorkerConfig, publish: Publish) -> SlotBackends:
    """The slot backends of ``cfg.backend``; ``publish`` sends the VM pool's heartbeats."""
    if cfg.backend == "libvirt":
        return VmPoolBackends(cfg, publish)
    return SlotBackends(cfg)
