"""The direct weight path's layout checks, on real TCPStores and gloo (no broker, no GPU): two
members on one GPU form no NCCL group (NCCL would refuse: "Duplicate GPU detected") and every
version goes through the blob store; a dropped group is aborted."""

from __future__ import annotations

import asyncio
import time
from datetime import timedelta

import torch.distributed as dist

import dart.rollout.weight_receive as rollout_transfer
import dart.train.weight_send as train_transfer
from dart.agent.config import TransferConfig
from dart.agent.weight_broadcast import abort_group, device_identity, shared_device
from dart.train.engine import free_port


def test_shared_device_names_the_ranks_on_one_device_and_cpu_members_never_collide():
    assert shared_device({0: "h/gpu/A", 1: "h/gpu/B", 2: "h2/gpu/A"}) is None
    assert shared_device({0: "h/gpu/A", 1: "h/gpu/B", 2: "h/gpu/A"}) == "ranks [0, 2] share h/gpu/A"
    assert device_identity("cpu").startswith(device_identity("cpu").rsplit("/", 1)[0])
    assert device_identity("cpu") == device_identity("cpu")  # one process, one identity


def test_trainer_and_worker_on_one_gpu_form_no_group_and_the_worker_takes_blobs(monkeypatch):
    """What the NCCL check sees on one card shared by the trainer and a worker (faked: no GPU
    here; the identity is what device_identity returns for two processes on one GPU)."""
    same_gpu = "host/gpu/GPU-5f1c0000-0000-0000-0000-000000000000"
    monkeypatch.setattr(train_transfer, "device_identity", lambda device: same_gpu)
    monkeypatch.setattr(rollout_transfer, "device_identity", lambda device: same_gpu)
    address = f"127.0.0.1:{free_port()}"
    sender = train_transfer.DirectSender(TransferConfig(kind="direct", address=address, backend="nccl",
                                                        device="cuda:0", timeout_s=10.0))
    receiver = rollout_transfer.DirectReceiver(
        TransferConfig(kind="direct", address=address, rank=1, backend="nccl", device="cuda:0", timeout_s=10.0), "w1")
    try:
        deadline = time.monotonic() + 30
        while (sender.blobs_only is None or receiver.blobs_only is None) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert sender.blobs_only is not None and "ranks [0, 1] share" in sender.blobs_only
        assert receiver.blobs_only is not None and "one GPU" in receiver.blobs_only
        assert not sender.ready and not receiver.in_group
        t0 = time.monotonic()
        assert asyncio.run(receiver.take(1)) is None      # straight to the blob store, no wait
        assert time.monotonic() - t0 < 2.0
    finally:
        receiver.close()
        sender.close()


def test_abort_group_aborts_a_real_group_and_swallows_a_broken_groups_refusal():
    store = dist.HashStore()
    group = dist.ProcessGroupGloo(store, 0, 1, timedelta(seconds=5))
    abort_group(group)  # gloo's abort: no error

    class Broken:
        aborted = 0

        def abort(self):
            Broken.aborted += 1
            raise RuntimeError("communicator already destroyed")

    abort_group(Broken())
    abort_group(object())  # a group without abort: nothing to do
    assert Broken.aborted == 1
