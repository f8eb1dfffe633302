"""Settings of the agent package's parts that services embed in their own configs: a module of
its own, so that reading them (``dart --help``, a config file's validation) loads no torch."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from dart.config import require


@dataclass(frozen=True, kw_only=True)
class TransferConfig:
    """How weight versions reach the rollout workers (the same section on both sides)."""

    kind: Literal["blobs", "direct"] = "blobs"
    """blobs: through the blob store only. direct: also broadcast over a process group."""
    address: str = "127.0.0.1:29600"
    """host:port of the trainer's rendezvous store (direct)."""
    workers: int = 1
    """Rollout workers in the group (direct): ranks 1..workers."""
    rank: int = 0
    """This rollout worker's rank in the group, 1..workers (the trainer is 0); 0 on a worker: not
    in the group (it follows through the blob store)."""
    bucket_mb: int = 256
    """Bytes in flight per broadcast step (one bucket on each side)."""
    timeout_s: float = 60.0
    """A broadcast (or the wait for a member) that takes longer fails; the version still reaches
    every worker through the blob store."""
    backend: Literal["auto", "gloo", "nccl"] = "auto"
    """auto: nccl when CUDA is available, else gloo."""
    device: str = "cpu"
    """Where buffers live (cpu, or cuda:N for nccl)."""

    def __post_init__(self) -> None:
        require(self.workers >= 1, "transfer.workers", f"must be >= 1, got {self.workers}")
        require(0 <= self.rank <= self.workers, "transfer.rank", f"must be in 0..workers, got {self.rank}")
        require(self.bucket_mb >= 1, "transfer.bucket_mb", f"must be >= 1, got {self.bucket_mb}")
        require(self.timeout_s > 0, "transfer.timeout_s", f"must be > 0, got {self.timeout_s}")
        require(":" in self.address, "transfer.address", f"must be host:port, got {self.address!r}")

    @property
    def host_port(self) -> tuple[str, int]:
        host, port = self.address.rsplit(":", 1)
        return host, int(port)

    @property
    def world(self) -> int:
        return self.workers + 1

    def resolved_backend(self) -> str:
        if self.backend != "auto":
            return self.backend
        import torch  # here, not at the top: reading the settings loads no torch

        return "nccl" if torch.cuda.is_available() and self.device.startswith("cuda") else "gloo"
