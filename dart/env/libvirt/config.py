"""The VM pool's settings: one frozen config, each field documented once."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from dart.config import require
from dart.resources import resource_dir

DEPLOY_TEMPLATE = resource_dir("libvirt") / "domain.xml.tmpl"
_PREFIX_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_.-]{0,40}$")


@dataclass(frozen=True, kw_only=True)
class VmPoolConfig:
    uri: str = "qemu:///system"
    """libvirt connection URI (``test:///default`` in tests; ``qemu:///system`` on an env host)."""
    name_prefix: str = "dart-vm"
    """Domains of this pool are named ``<prefix>-<slot>-<generation>``. At start-up every domain
    matching that pattern is destroyed: give each pool on a host its own prefix."""
    size: int = 1
    """VMs kept ready; a quarantined VM is replaced to keep the pool at this size."""
    template: Path = DEPLOY_TEMPLATE
    """Domain XML template (``string.Template``; see deploy/libvirt/README.md for the variables)."""
    template_vars: dict[str, str] = field(default_factory=lambda: {"network": "default"})
    """Extra ``${name}`` values for the template (the deploy template's libvirt ``network``,
    kernel paths, ...). Replaces the default mapping as a whole."""
    base_image: Path | None = None
    """qcow2 base image; each VM runs on its own overlay of it. None: the template has no disk."""
    overlay_dir: Path = Path("/var/lib/dart/vms")
    """Where overlays and per-VM run directories go (one sub-directory per domain). Files created
    here take the owner of this directory, so the hypervisor's user can write them."""
    memory_mib: int = 4096
    """Guest RAM (``${memory_mib}``). OSWorld's Ubuntu image wants 4096 or more."""
    vcpus: int = 2
    """Guest CPUs (``${vcpus}``)."""
    snapshot_name: str = "dart-clean"
    """The snapshot every reset reverts to; taken by the pool once the VM is first ready."""
    snapshot_mode: Literal["running", "offline"] = "running"
    """running: memory + disk snapshot of the ready guest (revert lands on a live desktop).
    offline: disk-only snapshot of the stopped domain (for hypervisors without memory
    snapshots; every reset then boots the guest)."""
    agent_port: int = 5000
    """Guest-agent TCP port inside the guest (OSWorld's server uses 5000)."""
    agent_urls: tuple[str, ...] = ()
    """Fixed guest-agent base URLs by slot (``http://host:port``). Empty: the pool finds each
    guest's address in libvirt's DHCP leases and uses ``agent_port``."""
    agent_token_file: Path | None = None
    """For agents the pool does not provision (``agent_urls`` of agents started by hand or by a
    test): the file holding the token they were started with. None: the pool makes a fresh
    random token for every VM it builds and hands it to the guest through the domain template
    (``${agent_token}``, see deploy/libvirt/README.md)."""
    ready_timeout_s: float = 300.0
    """How long a VM may take from start or revert until its guest agent answers."""
    probe_timeout_s: float = 5.0
    """Timeout of one readiness / health probe."""
    recycle_after: int = 50
    """Rebuild a VM from the base image after this many trajectories (0: never)."""
    quarantine_after: int = 3
    """Quarantine a VM after this many failures in a row (each failure recycles it first)."""
    keep_quarantined: bool = True
    """Leave a quarantined domain defined (stopped) with its overlay, for post-mortem."""
    build_concurrency: int = 2
    """VMs built (overlay, define, boot, snapshot) at the same time."""

    def __post_init__(self) -> None:
        require(bool(_PREFIX_RE.match(self.name_prefix)), "name_prefix",
                f"must be a letter then up to 40 of [A-Za-z0-9_.-], got {self.name_prefix!r}")
        require(self.size >= 1, "size", f"must be >= 1, got {self.size}")
        require(self.memory_mib >= 16, "memory_mib", f"must be >= 16, got {self.memory_mib}")
        require(self.vcpus >= 1, "vcpus", f"must be >= 1, got {self.vcpus}")
        require(self.ready_timeout_s > 0, "ready_timeout_s", f"must be > 0, got {self.ready_timeout_s}")
        require(self.probe_timeout_s > 0, "probe_timeout_s", f"must be > 0, got {self.probe_timeout_s}")
        require(self.recycle_after >= 0, "recycle_after", f"must be >= 0, got {self.recycle_after}")
        require(self.quarantine_after >= 1, "quarantine_after", f"must be >= 1, got {self.quarantine_after}")
        require(self.build_concurrency >= 1, "build_concurrency", f"must be >= 1, got {self.build_concurrency}")
        require(bool(self.snapshot_name) and "/" not in self.snapshot_name, "snapshot_name",
                f"must be a non-empty name without '/', got {self.snapshot_name!r}")
        require(not self.agent_urls or len(self.agent_urls) >= self.size, "agent_urls",
                f"gives {len(self.agent_urls)} URLs for {self.size} slots; give one per slot or none")
