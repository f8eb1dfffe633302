"""The worker side of the ``vllm`` engine: a vLLM worker extension (``worker_extension_cls``).

vLLM mixes this class into each of its GPU workers (in the engine-core process, not the rollout
worker's), so the engine reaches these methods by name through ``LLM.collective_rpc``: a method
name crosses vLLM's msgpack RPC, a Python function does not (vLLM refuses to pickle one unless
``VLLM_ALLOW_INSECURE_SERIALIZATION=1``). Importing this module never imports vLLM.
"""

from __future__ import annotations

from typing import Any

WORKER_EXTENSION = "dart.rollout.vllm_worker.DartWorkerExtension"
"""The qualified name vLLM imports in each worker (``LLM(worker_extension_cls=...)``)."""

RELOAD = "dart_reload_weights"
"""The RPC method name of a weight swap (checked against this class by the contract tests)."""


class DartWorkerExtension:
    """Methods vLLM adds to its ``Worker``; ``self`` is that worker (``reload_weights``,
    ``get_model`` and the rest are vLLM's own)."""

    def dart_reload_weights(self, path: str) -> int:
        """Load a full checkpoint-format state dict (one ``.safetensors`` file) into the live model
        through vLLM's layerwise reload, which also clears the encoder and multimodal caches of
        this worker; returns the number of tensors read.

        ``weights_iterator`` rather than ``weights_path``: vLLM repoints the model config at a
        ``weights_path``, and this file is a temporary one."""
        from safetensors.torch import load_file

        state = load_file(path, device="cpu")
        self.reload_weights(weights_iterator=iter(state.items()))  # type: ignore[attr-defined]
        return len(state)

    def dart_weight_count(self) -> int:
        """Parameters of the served model (through ``get_model``, the model runner's accessor)."""
        model: Any = self.get_model()  # type: ignore[attr-defined]
        return sum(1 for _ in model.named_parameters())
