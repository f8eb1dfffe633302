"""The direct weight path on the real broker: a trainer process broadcasts version 1 to two
rollout workers over a gloo group; both serve it with the trainer's exact tensors, the log
names the version and its digest, and a worker started late catches up from the blob store."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time

import pytest
import torch
import yaml

from dart.agent.config import TransferConfig
from dart.agent.model import load_policy
from dart.agent.weight_format import WEIGHTS_FILE, weights_blob, weights_sha256
from dart.blobs import LocalBlobStore, chunks
from dart.bus import read_topic
from dart.events import WeightsLoaded, WeightsPublished
from dart.rollout.hf_engine import HFEngine
from dart.rollout.service import RolloutWorker, RolloutWorkerConfig
from dart.train.checkpoint import latest_checkpoint, read_state
from dart.train.engine import free_port
from tests.train.test_resume import REPO, publish_batches, start, stop, write_config


async def until(check, what: str, timeout_s: float = 120.0, proc=None, log=None) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if proc is not None and proc.poll() is not None:
            pytest.fail(f"trainer exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: not after {timeout_s} s" + (f"\n{log.read_text()[-3000:]}" if log else ""))
        await asyncio.sleep(0.05)


@pytest.mark.kafka
@pytest.mark.slow
async def test_direct_path_two_workers_bit_identical_and_a_late_worker_from_the_blob_store(
        bus, tiny_dir, policy, tmp_path) -> None:
    from safetensors.torch import load_file

    store = LocalBlobStore(tmp_path / "blobs")
    transfer = {"kind": "direct", "address": f"127.0.0.1:{free_port()}", "workers": 2, "timeout_s": 20.0,
                "bucket_mb": 1}  # the tiny model is ~1.7 MB: two buckets
    config = write_config(tmp_path / "train.yaml", tiny_dir=tiny_dir, store=store, ckpt=tmp_path / "ckpt", bus=bus,
                          name="trainer-direct")
    body = yaml.safe_load(config.read_text())
    body["train"]["transfer"] = transfer
    config.write_text(yaml.safe_dump(body))
    log = tmp_path / "trainer.log"
    trainer = start(config, log)

    stopper = asyncio.Event()
    workers, tasks = [], []

    async def worker(name: str, cfg: TransferConfig) -> RolloutWorker:
        rcfg = RolloutWorkerConfig(model=str(tiny_dir), worker_id=name, run_id="resume", blobs=str(store.root),
                                   heartbeat_s=60, transfer=cfg)
        w = RolloutWorker(rcfg, HFEngine(load_policy(tiny_dir)), store, bus)
        workers.append(w)
        tasks.append(asyncio.create_task(w.run(stopper)))
        await w.ready(60)
        return w

    try:
        a = await worker("rollout-a", TransferConfig(**transfer, rank=1))
        b = await worker("rollout-b", TransferConfig(**transfer, rank=2))
        await until(lambda: a.follower.direct.in_group and b.follower.direct.in_group, "group formed",
                    proc=trainer, log=log)
        await publish_batches(bus, store, policy, range(1))
        await until(lambda: a.engine.version == 1 and b.engine.version == 1, "both workers on version 1",
                    proc=trainer, log=log)

        checkpoint = latest_checkpoint(tmp_path / "ckpt")
        assert read_state(checkpoint).version == 1
        trained = load_file(checkpoint / WEIGHTS_FILE)
        assert any(not torch.equal(trained[k], v) for k, v in policy.model.state_dict().items())
        for w in (a, b):
            assert w.follower.sources == {1: "direct"}
            assert 1 in w.follower.direct.received
            served = w.engine.policy.model.state_dict()
            assert served.keys() == trained.keys()
            assert all(torch.equal(served[k], trained[k]) and served[k].dtype == trained[k].dtype for k in trained)

        # The log names version 1 and its digest: the blob store holds exactly the trainer's bytes.
        published = [d.event async for d in read_topic(bus, bus.topics.weights)
                     if isinstance(d.event, WeightsPublished)]
        v1 = next(e for e in published if e.version == 1)
        assert v1.sha256 == weights_sha256(v1.blobs)
        # the weights' blob address: the sha256 of their chunk list (dart.blobs.chunks), hashed here anew
        assert weights_blob(v1).digest == chunks.list_address(chunks.hash_file(checkpoint / WEIGHTS_FILE))
        loaded = [d.event async for d in read_topic(bus, bus.topics.heartbeats) if isinstance(d.event, WeightsLoaded)]
        assert {(e.worker_id, e.version, e.ok) for e in loaded} == {("rollout-a", 1, True), ("rollout-b", 1, True)}
        assert "version 1 broadcast to 2 workers" in log.read_text()

        # A worker started late is in no group: it catches up from the blob store.
        late = await worker("rollout-late", TransferConfig(**{**transfer, "rank": 0}))
        assert late.follower.direct is None
        await until(lambda: late.engine.version == 1, "the late worker on version 1")
        assert late.follower.sources == {1: "blobs"}
        served = late.engine.policy.model.state_dict()
        assert all(torch.equal(served[k], trained[k]) for k in trained)
    finally:
        stopper.set()
        await asyncio.gather(*tasks, return_exceptions=True)
        stop(trainer)
    assert trainer.returncode == 0, log.read_text()[-3000:]


def test_wire_moves_every_dtype_bit_exactly_through_small_buckets() -> None:
    """The broadcast stream cut into 7-byte buckets (tensors split across buckets and several in
    one) gives every receiver the sender's bytes, dtypes and shapes."""
    import threading

    from dart.agent.weight_broadcast import (
        describe,
        new_group,
        open_store,
        receive_header,
        receive_tensors,
        send_header,
        send_tensors,
    )

    g = torch.Generator().manual_seed(0)
    state = {"w": torch.randn(5, 3, generator=g).to(torch.bfloat16), "b": torch.randn(7, generator=g),
             "scalar": torch.tensor(3.5, dtype=torch.float64), "ids": torch.arange(11), "mask": torch.rand(4) > 0.5,
             "empty": torch.zeros(0, 2)}
    cfg = TransferConfig(kind="direct", address=f"127.0.0.1:{free_port()}", workers=2, timeout_s=20.0)
    store = open_store(cfg, master=True)
    got: dict[int, dict] = {}

    def member(rank: int) -> None:
        client = store if rank == 0 else open_store(cfg, master=False)
        group = new_group(cfg, client, 1, rank)
        if rank == 0:
            send_header(group, {"version": 7, "tensors": describe(state)}, "cpu")
            assert send_tensors(group, state, 7, "cpu") == sum(t.numel() * t.element_size() for t in state.values())
        else:
            header = receive_header(group, "cpu")
            got[rank] = {"version": header["version"], "state": receive_tensors(group, header["tensors"], 7, "cpu")}

    threads = [threading.Thread(target=member, args=(r,)) for r in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert sorted(got) == [1, 2]
    for rank in (1, 2):
        assert got[rank]["version"] == 7
        received = got[rank]["state"]
        assert list(received) == list(state)
        for name, tensor in state.items():
            assert received[name].dtype == tensor.dtype and received[name].shape == tensor.shape
            assert torch.equal(received[name], tensor), name


_SHUTDOWN = """
import sys, time
from dart.agent.config import TransferConfig
from dart.rollout.weight_receive import open_receiver
from dart.train.weight_send import DirectSender
t = dict(kind="direct", address=sys.argv[1], workers=2, timeout_s=20.0)
sender = DirectSender(TransferConfig(**t, rank=0))
receivers = [open_receiver(TransferConfig(**t, rank=r), f"w{r}") for r in (1, 2)]
deadline = time.monotonic() + 60
while not (sender.ready and all(r.in_group for r in receivers)):
    assert time.monotonic() < deadline, "no group"
    time.sleep(0.02)
closing = [sender, *receivers] if sys.argv[2] == "trainer-first" else [*receivers, sender]
for c in closing:
    c.close()
print("closed", flush=True)
"""


@pytest.mark.parametrize("order", ["trainer-first", "trainer-first", "workers-first"])
def test_a_weights_group_closed_in_either_order_lets_the_process_exit_cleanly(order: str, tmp_path) -> None:
    """A gloo group left for the interpreter's exit to destroy aborted the trainer in CI
    ("terminate called without an active exception", exit -6); before the fix this script did so
    9 times in 10 trainer-first. Each close now waits for its thread and frees the group itself,
    and the trainer's stop tells its workers not to rejoin the dying generation."""
    done = subprocess.run([sys.executable, "-c", _SHUTDOWN, f"127.0.0.1:{free_port()}", order], cwd=REPO,
                          env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "closed" in done.stdout
    assert "terminate called" not in done.stderr
    assert "did not stop" not in done.stderr and "stuck" not in done.stderr
