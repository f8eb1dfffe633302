"""The direct weight path's wire: a ``torch.distributed`` group of the trainer and its rollout workers.

``transfer.kind: blobs`` (the default) moves every version through the blob store only.
``transfer.kind: direct`` also broadcasts it from the trainer (group rank 0) to the rollout
workers (ranks 1..``workers``) over a process group of their own: gloo on CPU, NCCL on GPUs.
The blob store still gets every version (``WeightsPublished`` names its blobs, so the log and a
replay stay complete, and a worker that missed a broadcast or started late fetches it there).

One broadcast = a header (JSON: version, tensor names, dtypes, shapes) and then the tensors'
bytes as one stream cut into buckets of ``bucket_mb``: the sender and every receiver hold one
bucket in flight, plus the receiver's destination tensors. A header ``{"tick": true}`` every
few seconds keeps an idle group inside its timeout.

Forming the group (a TCPStore served by the trainer at ``address``): the trainer writes the
generation ``gen``; each worker registers ``<gen>/worker/<rank>``; once all have, the trainer
writes ``<gen>/ready`` and every member builds the group under the prefix ``<gen>``. A failed
broadcast (a worker died) makes the trainer start the next generation; a worker whose group
fails (the trainer died or moved on) joins the next one.

Each member registers the device its buffers are on (:func:`device_identity`). NCCL refuses two
members on one GPU ("Duplicate GPU detected"), so on ``nccl`` a layout where any two share a GPU
(a trainer and a worker on one card) does not form a group: the trainer writes ``<gen>/ready`` =
``blobs: ...`` and every version goes through the blob store. A group that is dropped (a failed
broadcast, a lost peer) is aborted (:func:`abort_group`), not left to NCCL's watchdog, which
tears the whole process down.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
from collections.abc import Iterator, Sequence
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from dart.agent.config import TransferConfig

TICK_S = 2.0
"""Seconds between ticks of an idle group."""


def device_identity(device: str) -> str:
    """The physical device a member's buffers are on: host and GPU UUID for ``cuda``; host and
    process for ``cpu`` (gloo has no one-device rule, so CPU members never collide)."""
    host = socket.gethostname()
    if device.startswith("cuda"):
        return f"{host}/gpu/{torch.cuda.get_device_properties(torch.device(device)).uuid}"
    return f"{host}/cpu/{os.getpid()}"


def shared_device(identities: dict[int, str]) -> str | None:
    """Why these members (rank -> :func:`device_identity`) cannot form an NCCL group: the ranks
    that share a device; None when every member has a device of its own."""
    by_device: dict[str, list[int]] = {}
    for rank, ident in sorted(identities.items()):
        by_device.setdefault(ident, []).append(rank)
    shared = {d: r for d, r in by_device.items() if len(r) > 1}
    if not shared:
        return None
    return "; ".join(f"ranks {r} share {d}" for d, r in shared.items())


CLOSED_KEY = "closed"
"""Set in the store by a trainer that is stopping: its workers wait for the next trainer's store."""

BLOBS_ONLY = "blobs"
"""The prefix of a ``<gen>/ready`` value that tells the workers: no group, use the blob store."""


def abort_group(group: Any) -> None:
    """Abort a dropped group: its pending collectives end and its communicators are freed now
    (left alone, NCCL's watchdog notices the dead peer later and tears the process down)."""
    abort = getattr(group, "abort", None)
    if abort is not None:
        with contextlib.suppress(Exception):  # a group already broken may refuse; it is gone either way
            abort()


def open_store(cfg: TransferConfig, *, master: bool, connect_s: float | None = None) -> dist.TCPStore:
    """The rendezvous store (``master``: served here). ``connect_s``: give up connecting after that
    long (the caller retries: TCPStore's own retries back off for a minute and more)."""
    host, port = cfg.host_port
    store = dist.TCPStore(host, port, cfg.world if master else None, master,
                          timedelta(seconds=connect_s or cfg.timeout_s), wait_for_workers=False)
    store.set_timeout(timedelta(seconds=cfg.timeout_s))
    return store


def new_group(cfg: TransferConfig, store: dist.Store, gen: int, rank: int) -> Any:
    """The process group of generation ``gen`` (all members call this at about the same time)."""
    prefixed = dist.PrefixStore(f"g{gen}", store)
    timeout = timedelta(seconds=cfg.timeout_s)
    if cfg.resolved_backend() == "nccl":
        return dist.ProcessGroupNCCL(prefixed, rank, cfg.world, timeout=timeout)
    return dist.ProcessGroupGloo(prefixed, rank, cfg.world, timeout)


def _broadcast(group: Any, tensor: torch.Tensor) -> None:
    opts = dist.BroadcastOptions()
    opts.rootRank, opts.rootTensor = 0, 0
    group.broadcast([tensor], opts).wait()


def send_header(group: Any, header: dict[str, Any], device: str) -> None:
    body = torch.frombuffer(bytearray(json.dumps(header).encode()), dtype=torch.uint8)
    _broadcast(group, torch.tensor([body.numel()], dtype=torch.int64, device=device))
    _broadcast(group, body.to(device))


def receive_header(group: Any, device: str) -> dict[str, Any]:
    size = torch.zeros(1, dtype=torch.int64, device=device)
    _broadcast(group, size)
    body = torch.empty(int(size.item()), dtype=torch.uint8, device=device)
    _broadcast(group, body)
    header: dict[str, Any] = json.loads(bytes(body.cpu().numpy()))
    return header


def _dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, name.removeprefix("torch."), None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"not a torch dtype: {name!r}")
    return dtype


def describe(state: dict[str, torch.Tensor]) -> list[list[Any]]:
    """[name, dtype, shape] of every tensor, in sending order."""
    return [[name, str(t.dtype), list(t.shape)] for name, t in state.items()]


def _segments(views: Sequence[torch.Tensor], bucket: int) -> Iterator[list[tuple[int, int, int]]]:
    """The byte stream of ``views`` cut into buckets: per bucket, (view, start, end) pieces."""
    pieces: list[tuple[int, int, int]] = []
    room = bucket
    for i, view in enumerate(views):
        start = 0
        while start < view.numel():
            take = min(room, view.numel() - start)
            pieces.append((i, start, start + take))
            start += take
            room -= take
            if room == 0:
                yield pieces
                pieces, room = [], bucket
    if pieces:
        yield pieces


def _bytes(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().reshape(-1).view(torch.uint8)


def send_tensors(group: Any, state: dict[str, torch.Tensor], bucket_bytes: int, device: str) -> int:
    """Broadcast the tensors' bytes (after their header); returns the bytes sent."""
    views = [_bytes(t) for t in state.values()]
    buffer = torch.empty(bucket_bytes, dtype=torch.uint8, device=device)
    sent = 0
    for pieces in _segments(views, bucket_bytes):
        offset = 0
        for i, start, end in pieces:
            buffer[offset: offset + end - start].copy_(views[i][start:end])
            offset += end - start
        _broadcast(group, buffer[:offset])
        sent += offset
    return sent


def receive_tensors(group: Any, layout: list[list[Any]], bucket_bytes: int, device: str) -> dict[str, torch.Tensor]:
    """The tensors a header announced, on CPU: page-locked when the group runs on a GPU, so each
    bucket leaves it at the copy engine's speed and the swap loads from pinned memory (torch's
    pinned allocator caches freed blocks: the next version reuses them)."""
    pin = device.startswith("cuda")
    state = {name: torch.empty(shape, dtype=_dtype(dtype), pin_memory=pin) for name, dtype, shape in layout}
    views = [_bytes(t) for t in state.values()]
    buffer = torch.empty(bucket_bytes, dtype=torch.uint8, device=device)
    for pieces in _segments(views, bucket_bytes):
        size = sum(end - start for _, start, end in pieces)
        _broadcast(group, buffer[:size])
        offset = 0
        for i, start, end in pieces:
            views[i][start:end].copy_(buffer[offset: offset + end - start])
            offset += end - start
    return state
