"""The weight format of a policy version: files, blobs and digests.

A version is two files, published as two blobs: ``model.safetensors`` (the full HF
``state_dict()``, every tensor under its own name) and ``config.json`` (the HF model config).
``WeightsPublished.sha256`` is the sha256 of the lines ``"<name> <digest>"`` sorted and joined
with ``"\\n"`` (:func:`dart.blobs.blob_set_digest`): one digest that names the whole version.
The trainer writes this format, rollout workers read it; both import it from here.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dart.blobs import blob_set_digest
from dart.errors import BlobCorrupted

if TYPE_CHECKING:
    import torch

    from dart.events import BlobRef, WeightsPublished

WEIGHTS_FILE = "model.safetensors"
"""The file (and blob) of a version that holds the full HF ``state_dict()``."""
CONFIG_FILE = "config.json"
PUBLISHED_FILES = (WEIGHTS_FILE, CONFIG_FILE)
"""The files of a version, in publication order."""


def weights_sha256(blobs: Sequence[BlobRef]) -> str:
    """``WeightsPublished.sha256`` of a version's blobs (:func:`dart.blobs.blob_set_digest`)."""
    return blob_set_digest((b.name, b.digest) for b in blobs)


def check_version_digest(event: WeightsPublished) -> None:
    """BlobCorrupted unless ``event.sha256`` names exactly its blobs."""
    if event.sha256 != weights_sha256(event.blobs):
        raise BlobCorrupted(
            f"version {event.version}: sha256 {event.sha256[:12]}... does not match its blob list "
            "(publish it with dart.agent.weight_format.weights_sha256)"
        )


def weights_blob(event: WeightsPublished) -> BlobRef:
    """The ``model.safetensors`` blob of a version; BlobCorrupted when it has none."""
    for ref in event.blobs:
        if ref.name == WEIGHTS_FILE:
            return ref
    raise BlobCorrupted(f"version {event.version} has no {WEIGHTS_FILE} blob (has {[b.name for b in event.blobs]})")


def _fsync(path: Path) -> None:
    with open(path, "rb") as fh:
        os.fsync(fh.fileno())


def write_weights(state: Mapping[str, torch.Tensor], config_json: str, directory: Path) -> None:
    """``model.safetensors`` (every tensor, contiguous on CPU) + ``config.json`` in ``directory``, fsynced."""
    from safetensors.torch import save_file

    directory.mkdir(parents=True, exist_ok=True)
    save_file({k: v.detach().to("cpu").contiguous() for k, v in state.items()}, str(directory / WEIGHTS_FILE))
    (directory / CONFIG_FILE).write_text(config_json)
    for name in PUBLISHED_FILES:
        _fsync(directory / name)


def state_dict_to_bytes(model_or_state: Any) -> bytes:
    """The ``model.safetensors`` blob of a model (its full ``state_dict()``) or a state dict.

    Shared (tied) tensors are written once per name as contiguous CPU copies.
    """
    from safetensors.torch import save

    state = model_or_state.state_dict() if hasattr(model_or_state, "state_dict") else model_or_state
    return save({k: v.detach().to("cpu").contiguous().clone() for k, v in state.items()})


def state_dict_from_bytes(data: bytes) -> dict[str, torch.Tensor]:
    """Parse a ``model.safetensors`` blob; BlobCorrupted when it is not one."""
    from safetensors.torch import load

    try:
        state = load(data)
    except Exception as exc:  # safetensors raises its own SafetensorError and others
        raise BlobCorrupted(f"weights blob is not a readable safetensors file: {exc}") from exc
    if not state:
        raise BlobCorrupted("weights blob holds no tensors")
    return state


def check_state_dict(model: Any, state: dict[str, torch.Tensor]) -> None:
    """Raise BlobCorrupted unless ``state`` has exactly the model's tensor names and shapes."""
    own = model.state_dict()
    missing = sorted(set(own) - set(state))
    extra = sorted(set(state) - set(own))
    if missing or extra:
        raise BlobCorrupted(f"weights do not fit the model: missing {missing[:3]}, unexpected {extra[:3]}")
    for name, tensor in own.items():
        if tuple(state[name].shape) != tuple(tensor.shape):
            raise BlobCorrupted(f"weights do not fit the model: {name} has shape {tuple(state[name].shape)}")
        if state[name].is_floating_point() and not bool(state[name].isfinite().all()):
            raise BlobCorrupted(f"weights hold non-finite values in {name}")
