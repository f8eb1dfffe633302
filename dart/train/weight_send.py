"""How the trainer moves a published version's bytes: the blob store, or also a direct broadcast.

Both return the blob refs ``WeightsPublished`` names: every version is in the blob store, so the
log says where each one can be fetched whichever path carried it first. The direct sender
(:class:`DirectSender`, wire in :mod:`dart.agent.weight_broadcast`) broadcasts the version from the
checkpoint's ``model.safetensors`` (the same bytes as the blob) while the blob is stored.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from pathlib import Path
from typing import Any, Protocol

from dart.agent.weight_broadcast import (
    BLOBS_ONLY,
    CLOSED_KEY,
    TICK_S,
    TransferConfig,
    abort_group,
    describe,
    device_identity,
    new_group,
    open_store,
    send_header,
    send_tensors,
    shared_device,
)
from dart.agent.weight_format import WEIGHTS_FILE
from dart.blobs import BlobStore
from dart.events import BlobRef
from dart.train.weight_publish import put_weights

log = logging.getLogger(__name__)


class WeightTransfer(Protocol):
    def publish(self, version: int, checkpoint: Path, store: BlobStore) -> list[BlobRef]:
        """Move ``checkpoint``'s weights as ``version``; returns the blob refs of the version."""
        ...

    def close(self) -> None: ...


class BlobTransfer:
    """Today's path: the version's files into the blob store; each worker reads them from there."""

    def publish(self, version: int, checkpoint: Path, store: BlobStore) -> list[BlobRef]:
        return put_weights(store, checkpoint, link=True)   # a committed checkpoint: never written again

    def close(self) -> None:
        pass


class DirectSender:
    """Rank 0 of the weights group: broadcasts every version to the rollout workers of the group.

    A thread owns the group: it forms it (waiting for every worker, in the background: versions
    published before it is complete go through the blob store only), broadcasts what
    :meth:`publish` hands it, ticks when idle, and starts a new generation when a broadcast fails.
    """

    def __init__(self, cfg: TransferConfig) -> None:
        self.cfg = cfg
        self.store: Any = open_store(cfg, master=True)
        self.gen = 0
        self.group: Any = None
        self.newest = -1
        """The newest version published (broadcast or not): ticks tell the workers, so that none waits
        for a version that will not come."""
        self.blobs_only: str | None = None
        """Why this layout broadcasts nothing (two members on one GPU under NCCL), else None."""
        self.sent: dict[int, float] = {}
        """Seconds each version's broadcast took (versions that went by the blob store only: absent)."""
        self._jobs: queue.Queue[tuple[int, Path, threading.Event] | tuple[()] | None] = queue.Queue()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="weights-sender", daemon=True)
        self._thread.start()

    @property
    def ready(self) -> bool:
        return self.group is not None

    def _form(self) -> None:
        self.gen += 1
        self.store.set("gen", str(self.gen))
        keys = [f"{self.gen}/worker/{r}" for r in range(1, self.cfg.world)]
        log.info("weights group: generation %d waits for %d workers at %s", self.gen, self.cfg.workers,
                 self.cfg.address)
        while not self._closed and not self.store.check(keys):
            time.sleep(0.1)
        if self._closed:
            return
        if self.cfg.resolved_backend() == "nccl":
            members = {0: device_identity(self.cfg.device)}
            members.update({r: self.store.get(k).decode() for r, k in enumerate(keys, start=1)})
            if (why := shared_device(members)) is not None:
                self.blobs_only = f"NCCL cannot put two members on one GPU ({why})"
                self.store.set(f"{self.gen}/ready", f"{BLOBS_ONLY}: {self.blobs_only}")
                log.warning("weights group: not formed, every version goes through the blob store: %s",
                            self.blobs_only)
                return
        self.store.set(f"{self.gen}/ready", "1")
        self.group = new_group(self.cfg, self.store, self.gen, 0)
        log.info("weights group: generation %d formed (%d workers)", self.gen, self.cfg.workers)

    def _run(self) -> None:
        while not self._closed:
            if self.blobs_only is not None:  # a layout the group cannot have: nothing to do
                time.sleep(TICK_S)
                continue
            if self.group is None:
                try:
                    self._form()
                except Exception as exc:  # a member that left midway: the next generation
                    log.warning("weights group: generation %d failed to form: %s", self.gen, exc)
                    self.group = None
                continue
            try:
                job = self._jobs.get(timeout=TICK_S)
            except queue.Empty:
                job = None if self._closed else ()
            try:
                if job is None:
                    # a worker the stop sends back to the store must not rejoin this generation
                    self.store.set(CLOSED_KEY, "1")
                    send_header(self.group, {"stop": True}, self.cfg.device)
                    return
                if not job:
                    send_header(self.group, {"tick": True, "newest": self.newest}, self.cfg.device)
                    continue
                version, path, done = job
                try:
                    self._send(version, path)
                finally:
                    self.newest = max(self.newest, version)
                    done.set()
            except Exception as exc:  # a worker died: blob store only until a new group forms
                log.warning("weights group: broadcast failed (%s: %s); next generation", type(exc).__name__, exc)
                abort_group(self.group)
                self.group = None

    def _send(self, version: int, path: Path) -> None:
        from safetensors.torch import load_file

        start = time.perf_counter()
        state = load_file(path / WEIGHTS_FILE)
        send_header(self.group, {"version": version, "tensors": describe(state)}, self.cfg.device)
        sent = send_tensors(self.group, state, self.cfg.bucket_mb << 20, self.cfg.device)
        self.sent[version] = time.perf_counter() - start
        log.info("weights group: version %d broadcast to %d workers: %.1f MB in %.3f s", version, self.cfg.workers,
                 sent / 1e6, self.sent[version])

    def publish(self, version: int, checkpoint: Path, store: BlobStore) -> list[BlobRef]:
        """Broadcast (if the group is formed) while the blob store gets its copy; returns the refs."""
        done = threading.Event()
        if self.ready:
            self._jobs.put((version, checkpoint, done))
        else:
            log.info("weights group not formed yet: version %d through the blob store only", version)
            self.newest = max(self.newest, version)
            done.set()
        refs = put_weights(store, checkpoint, link=True)
        done.wait()
        return refs

    def close(self) -> None:
        self._closed = True
        if self.group is not None:
            self._jobs.put(None)
        # a tick to workers that left may wait out the group's timeout before the stop is sent
        self._thread.join(timeout=TICK_S + 2 * self.cfg.timeout_s)
        if self._thread.is_alive():
            log.warning("weights group: the sender is stuck in a broadcast; aborting the group")
            abort_group(self.group)
            self._thread.join(timeout=TICK_S)
        # The group and the store are freed here, in this thread: left to the interpreter's exit,
        # gloo's destructor can abort the process ("terminate called without an active exception").
        self.group = None
        self.store = None


def make_transfer(cfg: TransferConfig) -> WeightTransfer:
    return DirectSender(cfg) if cfg.kind == "direct" else BlobTransfer()
