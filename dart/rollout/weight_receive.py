"""A rollout worker's end of the direct weight path (wire: :mod:`dart.agent.weight_broadcast`).

A thread keeps the worker in the trainer's weights group (joining each new generation) and
receives every broadcast version into a staged CPU state dict (the newest only). The
:class:`~dart.rollout.weight_swap.WeightFollower` still acts on ``WeightsPublished`` alone: for an
announced version it takes the staged tensors (waiting while the broadcast is under way) and
swaps them in like a blob-store fetch; a version this worker did not get (not in the group, a
failed broadcast, a worker started late) comes from the blob store.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from typing import Any

from dart.agent.weight_broadcast import (
    BLOBS_ONLY,
    CLOSED_KEY,
    TICK_S,
    TransferConfig,
    abort_group,
    device_identity,
    new_group,
    open_store,
    receive_header,
    receive_tensors,
)

log = logging.getLogger(__name__)


class DirectReceiver:
    def __init__(self, cfg: TransferConfig, worker_id: str) -> None:
        self.cfg = cfg
        self.worker_id = worker_id
        self.in_group = False
        self.received: dict[int, float] = {}
        """Seconds each version's tensors took to arrive (header to last byte)."""
        self.blobs_only: str | None = None
        """The trainer's reason for forming no group (two members on one GPU), else None."""
        self._staged: tuple[int, dict[str, Any]] | None = None
        self._newest = -1  # the newest version the trainer published (broadcast or not)
        self._cond = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name=f"weights-receiver-{cfg.rank}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._closed:
            try:
                # a plain connect first: TCPStore logs a warning with a stack trace per failed try
                socket.create_connection(self.cfg.host_port, timeout=1.0).close()
                store = open_store(self.cfg, master=False, connect_s=1.0)
                gen = int(store.get("gen"))
                if store.check([CLOSED_KEY]):  # the trainer is stopping: wait for the next one
                    time.sleep(0.5)
                    continue
                store.set(f"{gen}/worker/{self.cfg.rank}", device_identity(self.cfg.device))
                store.wait([f"{gen}/ready"])
                ready = store.get(f"{gen}/ready").decode()
                if ready.startswith(BLOBS_ONLY):  # the trainer will not form a group for this layout
                    self.blobs_only = ready
                    log.warning("worker %s: no weights group, versions come from the blob store: %s",
                                self.worker_id, ready)
                    with self._cond:
                        self._cond.notify_all()
                    return
                group = new_group(self.cfg, store, gen, self.cfg.rank)
            except Exception as exc:  # the trainer is not there (yet): try again
                log.debug("worker %s: weights group not joined: %s", self.worker_id, exc)
                time.sleep(0.5)
                continue
            log.info("worker %s: in the weights group (generation %d, rank %d)", self.worker_id, gen, self.cfg.rank)
            self.in_group = True
            try:
                self._receive(group)
            except Exception as exc:  # the trainer died or started a new generation
                log.warning("worker %s: weights group lost (%s: %s)", self.worker_id, type(exc).__name__, exc)
            finally:
                abort_group(group)
                self.in_group = False
                with self._cond:
                    self._cond.notify_all()

    def _receive(self, group: Any) -> None:
        bucket = self.cfg.bucket_mb << 20
        while not self._closed:
            header = receive_header(group, self.cfg.device)
            if header.get("stop"):
                return
            if "newest" in header:
                with self._cond:
                    self._newest = max(self._newest, int(header["newest"]))
                    self._cond.notify_all()
            if "version" not in header:
                continue
            start = time.perf_counter()
            state = receive_tensors(group, header["tensors"], bucket, self.cfg.device)
            version = int(header["version"])
            with self._cond:
                self.received[version] = time.perf_counter() - start
                self._staged = (version, state)
                self._newest = max(self._newest, version)
                self._cond.notify_all()

    def _take(self, version: int) -> dict[str, Any] | None:
        deadline = time.monotonic() + self.cfg.timeout_s
        with self._cond:
            while True:
                if self._staged is not None and self._staged[0] == version:
                    state = self._staged[1]
                    self._staged = None
                    return state
                left = deadline - time.monotonic()
                # not coming: not in the group, the trainer sent it before this worker joined, or too late
                if not self.in_group or self._newest >= version or left <= 0 or self._closed:
                    return None
                self._cond.wait(min(left, 0.5))

    async def take(self, version: int) -> dict[str, Any] | None:
        """The broadcast tensors of ``version`` (an announced one), or None: fetch it from the blob store."""
        import asyncio

        return await asyncio.to_thread(self._take, version)

    def close(self) -> None:
        """Leave the group. Gloo cannot interrupt a pending receive, so the thread ends at the
        trainer's next tick or stop (or when the trainer is gone) and frees the group itself;
        waiting for that here keeps the group from being torn down by the interpreter's exit,
        which can abort the process."""
        self._closed = True
        with self._cond:
            self._cond.notify_all()
        self._thread.join(timeout=TICK_S + 1.0)
        if self._thread.is_alive():
            log.warning("worker %s: the weights receiver did not stop within %.0f s", self.worker_id, TICK_S + 1.0)


def open_receiver(cfg: TransferConfig, worker_id: str) -> DirectReceiver | None:
    """The receiver of a worker in the weights group (``transfer.kind: direct`` and a rank), else None."""
    if cfg.kind != "direct" or cfg.rank == 0:
        return None
    return DirectReceiver(cfg, worker_id)
