"""``dart rollout-worker``'s settings (YAML section ``rollout``): a module of its own, so that
what reads them (``dart --help``, the stack's config) loads no engine, bus client or torch."""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field
from typing import Literal

from dart.agent.config import TransferConfig
from dart.agent.prompt import PromptConfig
from dart.config import require
from dart.rollout.hf_engine import HFEngineConfig
from dart.rollout.openai_engine import OpenAIEngineConfig
from dart.rollout.vllm_engine import VLLMEngineConfig


def default_worker_id() -> str:
    return f"rollout-{socket.gethostname()}-{os.getpid()}"


@dataclass(frozen=True, kw_only=True)
class RolloutWorkerConfig:
    """``dart rollout-worker`` settings (YAML section ``rollout``)."""

    engine: Literal["hf", "openai", "vllm"] = "hf"
    """Inference backend."""
    model: str = ""
    """Model directory for hf / vllm (``dart model tiny DIR`` builds a test one)."""
    device: str = "cpu"
    """Torch device of the hf engine."""
    dtype: str | None = None
    """Torch dtype name for hf (None: float32 on CPU, the checkpoint's on GPU)."""
    blobs: str = ".dart/blobs"
    """Blob store (directory or file:// URL) holding screenshots and weights."""
    worker_id: str = ""
    """This worker's id (empty: rollout-HOST-PID)."""
    run_id: str = "dev"
    """Run id stamped on the events this worker writes."""
    group: str = "rollout"
    """Consumer group on the observations topic (shared by all rollout workers)."""
    max_concurrency: int = 16
    """Observations answered at once (the hf engine batches them)."""
    follow_weights: bool = True
    """Follow the weights topic and swap versions (ignored by the openai engine)."""
    heartbeat_s: float = 10.0
    """Seconds between WorkerHeartbeat events."""
    convention: Literal["qwen25vl", "qwen2vl"] = "qwen25vl"
    """Coordinate convention of the model's answers (UI-TARS-1.5: qwen25vl)."""
    prompt: PromptConfig = field(default_factory=PromptConfig)
    transfer: TransferConfig = field(default_factory=TransferConfig)
    """The direct weight path (``kind: direct`` and this worker's ``rank``); default: the blob store."""
    hf: HFEngineConfig = field(default_factory=HFEngineConfig)
    openai: OpenAIEngineConfig = field(default_factory=OpenAIEngineConfig)
    vllm: VLLMEngineConfig = field(default_factory=VLLMEngineConfig)

    def __post_init__(self) -> None:
        require(self.max_concurrency >= 1, "max_concurrency", f"must be >= 1, got {self.max_concurrency}")
        require(self.heartbeat_s > 0, "heartbeat_s", f"must be > 0, got {self.heartbeat_s}")
        require(
            self.engine == "openai" or bool(self.model),
            "model",
            f"the {self.engine} engine needs a model directory (dart model tiny DIR builds one)",
        )

    @property
    def worker(self) -> str:
        return self.worker_id or default_worker_id()
