"""``dart env-worker`` settings: the worker's slots, its backend and the backend's own section.

Its own module so that the worker (:mod:`dart.env.worker`) and the slot backends
(:mod:`dart.env.backends`) both read it without importing each other.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field
from typing import Literal

from dart.config import require
from dart.env.libvirt.config import VmPoolConfig
from dart.env.synthetic.backend import SyntheticConfig
from dart.env.xdesktop.backend import XDesktopConfig


@dataclass(frozen=True, kw_only=True)
class EnvWorkerConfig:
    """``dart env-worker`` settings (YAML section ``env``)."""

    backend: Literal["synthetic", "xdesktop", "libvirt"] = "synthetic"
    """Environment backend of every slot; the worker takes only requests for this backend."""
    slots: int = 4
    """Trajectories run at once (environments owned by this worker)."""
    run_id: str = "dev"
    """Run id stamped on the events this worker writes."""
    worker_id: str = ""
    """This worker's id (empty: env-HOST-PID)."""
    reply_partition: int | None = None
    """The partition of the actions topic this worker alone reads its policy answers from
    (None: a hash of worker_id, which other workers may share, and each then reads and skips
    the others' answers). Give worker i partition i, with ``bus.partitions["rollout.actions"]``
    at least the number of env workers."""
    group: str = ""
    """Consumer group on the requests topic (empty: env-workers-<backend>)."""
    blobs: str = ".dart/blobs"
    """Blob store (directory or file:// URL) that receives screenshots."""
    reply_timeout_s: float = 120.0
    """How long one step waits for the policy's ActionChosen before it is an infra error."""
    max_attempts: int = 3
    """Tries per request (first run + re-queues after infra errors)."""
    requeue: bool = True
    """Re-produce a request after an infra error (off when the data manager owns retries)."""
    success_threshold: float = 1.0
    """A trajectory is 'success' when its reward reaches this (1.0: the task fully done)."""
    heartbeat_s: float = 5.0
    """Seconds between WorkerHeartbeat events."""
    task_files: tuple[str, ...] = ()
    """Task files or folders loaded at start, besides the tasks topic."""
    task_wait_s: float = 30.0
    """How long a request waits for its task to show up on the tasks topic."""
    close_timeout_s: float = 30.0
    """How long closing a broken backend may take before it is abandoned."""
    synthetic: SyntheticConfig = field(default_factory=SyntheticConfig)
    xdesktop: XDesktopConfig = field(default_factory=XDesktopConfig)
    libvirt: VmPoolConfig = field(default_factory=VmPoolConfig)
    """The VM pool of the libvirt backend (one pool per worker; its ``size`` VMs serve the slots)."""

    def __post_init__(self) -> None:
        require(self.slots >= 1, "slots", f"must be >= 1, got {self.slots}")
        require(self.max_attempts >= 1, "max_attempts", f"must be >= 1, got {self.max_attempts}")
        require(self.reply_timeout_s > 0, "reply_timeout_s", f"must be > 0, got {self.reply_timeout_s}")
        require(self.reply_partition is None or self.reply_partition >= 0, "reply_partition",
                f"must be >= 0 (or unset), got {self.reply_partition}")
        require(self.heartbeat_s > 0, "heartbeat_s", f"must be > 0, got {self.heartbeat_s}")
        # Every running trajectory holds a VM: with fewer VMs than slots, some slots would take
        # requests and then wait for a VM.
        require(self.backend != "libvirt" or self.libvirt.size >= self.slots, "libvirt.size",
                f"{self.libvirt.size} VMs for {self.slots} slots; set libvirt.size >= slots (or fewer slots)")

    @property
    def worker(self) -> str:
        return self.worker_id or f"env-{socket.gethostname()}-{os.getpid()}"

    @property
    def group_name(self) -> str:
        return self.group or f"env-workers-{self.backend}"
