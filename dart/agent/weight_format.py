"""The weight format of a policy version: files, blobs and digests.

A version is two files, published as two blobs: ``model.safetensors`` (the full HF
``state_dict()``, every tensor under its own name) and ``config.json`` (the HF model config).
``WeightsPublished.sha256`` is the sha256 of the lines ``"<name> <digest>"`` sorted and joined
with ``"\\n"`` (:func:`dart.blobs.blob_set_digest`): one digest that names the whole version.
The trainer writes this format, rollout workers read it; both import it from here.
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Iterator, Mapping, Sequence
from itertools import pairwise
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dart.blobs import _CHUNK, blob_set_digest, chunks, write_hashed
from dart.errors import BlobCorrupted

if TYPE_CHECKING:
    import torch

    from dart.events import BlobRef, WeightsPublished

WEIGHTS_FILE = "model.safetensors"
"""The file (and blob) of a version that holds the full HF ``state_dict()``."""
CONFIG_FILE = "config.json"
PUBLISHED_FILES = (WEIGHTS_FILE, CONFIG_FILE)
"""The files of a version, in publication order."""
SUMS_FILE = "SHA256SUMS"
"""Beside a version's files: their blob addresses as :func:`write_weights` hashed them while
writing, so a committed checkpoint is published without being read again. Not published itself.
``config.json``'s is its sha256 (``sha256sum -c`` checks that line); ``model.safetensors`` is a
chunked blob (:mod:`dart.blobs.chunks`): its address is the sha256 of its chunk list, the file
``model.safetensors.chunks`` beside it."""
CHUNKS_FILE = WEIGHTS_FILE + chunks.SUFFIX
"""The chunk list of ``model.safetensors`` (its blob address is this file's sha256)."""

_DTYPES: dict[str, tuple[str, int]] = {
    # torch dtype name: (safetensors name, element bytes). In the order safetensors sorts the
    # tensors of a file: this dtype rank descending, then by name. An allow-list: a dtype not
    # here is refused on write and on read.
    "bool": ("BOOL", 1), "uint8": ("U8", 1), "int8": ("I8", 1), "float8_e5m2": ("F8_E5M2", 1),
    "float8_e4m3fn": ("F8_E4M3", 1), "int16": ("I16", 2), "uint16": ("U16", 2), "float16": ("F16", 2),
    "bfloat16": ("BF16", 2), "int32": ("I32", 4), "uint32": ("U32", 4), "float32": ("F32", 4),
    "float64": ("F64", 8), "int64": ("I64", 8), "uint64": ("U64", 8),
}
_RANK = {name: rank for rank, name in enumerate(_DTYPES)}
_BY_SAFETENSORS = {st: torch_name for torch_name, (st, _) in _DTYPES.items()}
_HEADER_MAX = 100 << 20
"""Longest header read (safetensors' own limit): a length beyond it is a corrupted file."""


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


def _tensor_bytes(tensor: torch.Tensor) -> torch.Tensor:
    """A tensor's bytes as a flat uint8 tensor on the CPU: a view, no copy, of a contiguous CPU tensor."""
    import torch

    flat = tensor.detach().to("cpu").contiguous().reshape(-1)
    return flat.view(torch.uint8) if flat.numel() else torch.empty(0, dtype=torch.uint8)


def safetensors_chunks(state: Mapping[str, torch.Tensor]) -> Iterator[memoryview]:
    """The bytes of ``state`` as a ``.safetensors`` file, the same bytes ``safetensors.torch.save``
    writes, tensor by tensor: the header, then views of each tensor's memory (no copy of a CPU
    tensor; a GPU tensor is copied to the CPU one at a time), in chunks of at most 8 MB.

    The order is safetensors' own (dtype rank descending, then name), so every tensor starts
    aligned to its element size and the file's digest is that of the library's file.
    """
    order = sorted(state, key=lambda k: (-_RANK.get(str(state[k].dtype).removeprefix("torch."), 0), k))
    header: dict[str, Any] = {}
    start = 0
    for name in order:
        tensor = state[name]
        dtype = str(tensor.dtype).removeprefix("torch.")
        if dtype not in _DTYPES:
            raise ValueError(f"tensor {name!r}: dtype {tensor.dtype} cannot be written (allowed: {', '.join(_DTYPES)})")
        end = start + tensor.numel() * _DTYPES[dtype][1]
        header[name] = {"dtype": _DTYPES[dtype][0], "shape": list(tensor.shape), "data_offsets": [start, end]}
        start = end
    text = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode()
    text += b" " * (-len(text) % 8)                      # data starts 8-byte aligned, as safetensors pads
    yield memoryview(struct.pack("<Q", len(text)) + text)
    for name in order:
        data = _tensor_bytes(state[name])
        if not data.numel():
            continue
        view = memoryview(data.numpy())
        for i in range(0, len(view), _CHUNK):
            yield view[i:i + _CHUNK]


def write_weights(state: Mapping[str, torch.Tensor], config_json: str, directory: Path) -> dict[str, str]:
    """``model.safetensors`` (every tensor written from its own memory, chunk by chunk on every
    core, each chunk hashed from the memory it is written from, one fsync) with its chunk list,
    ``config.json``, and ``SHA256SUMS`` naming both in ``directory``; returns ``{file: blob address}``.

    No copy of the state is made, and its digest costs no second read of the file: publishing
    the version from a committed checkpoint links the file into the blob store without reading
    it (``dart.train.weight_publish.put_weights``)."""
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / WEIGHTS_FILE, "wb", buffering=0) as fh:
        listing = chunks.write_chunked(fh.fileno(), safetensors_chunks(state))
    (directory / CHUNKS_FILE).write_bytes(listing)
    _fsync(directory / CHUNKS_FILE)
    digests = {WEIGHTS_FILE: chunks.list_address(listing)}
    with open(directory / CONFIG_FILE, "wb", buffering=0) as fh:
        digests[CONFIG_FILE] = write_hashed(fh, [config_json.encode()])
    sums = directory / SUMS_FILE
    sums.write_text("".join(f"{digests[name]}  {name}\n" for name in PUBLISHED_FILES))
    _fsync(sums)
    return digests


def written_digests(directory: Path) -> dict[str, str]:
    """``{file: sha256}`` from a version directory's ``SHA256SUMS`` (empty when it has none,
    e.g. a directory written before it existed); a line that is not ``<sha256>  <file>`` of a
    published file is ignored (the files are then hashed when published)."""
    try:
        text = (directory / SUMS_FILE).read_text()
    except (FileNotFoundError, UnicodeDecodeError):
        return {}
    found = {}
    for line in text.splitlines():
        digest, _, name = line.partition("  ")
        if name in PUBLISHED_FILES and len(digest) == 64 and all(c in "0123456789abcdef" for c in digest):
            found[name] = digest
    return found


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


def state_dict_from_buffer(buf: bytearray) -> dict[str, torch.Tensor]:
    """Parse a ``model.safetensors`` blob held in ``buf`` (:meth:`dart.blobs.LocalBlobStore.get_buffer`)
    without copying it: every tensor is a view of ``buf`` (which they keep alive). BlobCorrupted
    when it is not a safetensors file of allowed dtypes whose tensors tile its data exactly.
    """
    import torch

    size = len(buf)
    if size < 8:
        raise BlobCorrupted(f"weights blob is not a readable safetensors file: {size} bytes")
    (n,) = struct.unpack_from("<Q", buf)
    if n > min(_HEADER_MAX, size - 8):
        raise BlobCorrupted(f"weights blob is not a readable safetensors file: header of {n} bytes in {size}")
    try:
        header = json.loads(bytes(buf[8:8 + n]))
    except (UnicodeDecodeError, ValueError) as exc:
        raise BlobCorrupted(f"weights blob is not a readable safetensors file: header: {exc}") from exc
    if not isinstance(header, dict):
        raise BlobCorrupted("weights blob is not a readable safetensors file: header is not an object")
    header.pop("__metadata__", None)
    if not header:
        raise BlobCorrupted("weights blob holds no tensors")
    data = torch.frombuffer(buf, dtype=torch.uint8) if size else torch.empty(0, dtype=torch.uint8)
    base = 8 + n
    spans = []
    state = {}
    for name, info in header.items():
        try:
            dtype = _BY_SAFETENSORS[info["dtype"]]
            shape = [int(d) for d in info["shape"]]
            start, end = (int(x) for x in info["data_offsets"])
        except (KeyError, TypeError, ValueError) as exc:
            raise BlobCorrupted(f"weights blob: tensor {name!r} has a bad entry {info!r}") from exc
        count = 1
        for d in shape:
            count *= d
        if min(shape, default=0) < 0 or not 0 <= start <= end <= size - base \
                or end - start != count * _DTYPES[dtype][1]:
            raise BlobCorrupted(f"weights blob: tensor {name!r} ({info['dtype']} {shape}) does not fit bytes "
                                f"[{start}, {end}) of {size - base}")
        spans.append((start, end))
        raw = data[base + start:base + end]
        if (base + start) % _DTYPES[dtype][1]:        # not aligned (another writer): this tensor is copied
            raw = raw.clone()
        state[name] = raw.view(getattr(torch, dtype)).reshape(shape)
    spans.sort()
    if spans[0][0] != 0 or spans[-1][1] != size - base or any(a[1] != b[0] for a, b in pairwise(spans)):
        raise BlobCorrupted("weights blob: its tensors overlap or leave bytes unaccounted for")
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
