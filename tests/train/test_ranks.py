"""The trainer on two ranks under torchrun (CPU, gloo) on a real broker: every rank trains on its
shard of the same batches, the weights equal a one-rank trainer's, and a rank killed mid-update
stops the group with the batch uncommitted; the restart does it once, nothing skipped."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from aiokafka import AIOKafkaConsumer, TopicPartition

from dart.blobs import LocalBlobStore
from dart.events import TrainStepCompleted
from dart.train.checkpoint import latest_checkpoint, read_state
from dart.train.engine import free_port
from tests.train.test_resume import events_of, publish_batches, start, stop, wait_for_seq, write_config

REPO = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.kafka, pytest.mark.slow]


async def publish(bus, store: LocalBlobStore, policy, seqs: range) -> None:
    await publish_batches(bus, store, policy, seqs, groups=2)


def torchrun(config: Path, log: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", str(free_port()),
         "-m", "dart.train", str(config)],
        cwd=REPO, env=env, stdout=log.open("ab"), stderr=subprocess.STDOUT)


def wait_for_line(log: Path, pattern: str, proc: subprocess.Popen, timeout_s: float = 120.0) -> re.Match[str]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if found := re.search(pattern, log.read_text(errors="replace")):
            return found
        if proc.poll() is not None:
            pytest.fail(f"exited with {proc.returncode} before {pattern!r}:\n{log.read_text()[-3000:]}")
        time.sleep(0.02)
    pytest.fail(f"no {pattern!r} after {timeout_s} s:\n{log.read_text()[-3000:]}")


async def committed(bus, group: str, until: int | None = None, timeout_s: float = 30.0) -> int | None:
    """The group's committed offset on the batches topic (``until``: once it reaches that, or the last seen)."""
    probe = AIOKafkaConsumer(**bus.aiokafka(group_id=bus.group_id(group), enable_auto_commit=False))
    await probe.start()
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            offset = await probe.committed(TopicPartition(bus.topics.batches, 0))
            if until is None or offset == until or time.monotonic() > deadline:
                return offset
            await asyncio.sleep(0.1)
    finally:
        await probe.stop()


async def test_two_ranks_train_shards_match_one_rank_and_survive_a_killed_rank(
        bus, tiny_dir, tiny_policy, tmp_path) -> None:
    from safetensors.torch import load_file

    store = LocalBlobStore(tmp_path / "blobs")
    await publish(bus, store, tiny_policy, range(2))
    one = write_config(tmp_path / "one.yaml", tiny_dir=tiny_dir, store=store, ckpt=tmp_path / "ckpt-one", bus=bus,
                       name="trainer-one")
    two = write_config(tmp_path / "two.yaml", tiny_dir=tiny_dir, store=store, ckpt=tmp_path / "ckpt-two", bus=bus,
                       name="trainer-two")
    body = yaml.safe_load(two.read_text())
    body["train"]["engine"]["dist_timeout_s"] = 20.0
    if engine := os.environ.get("DART_TEST_RANKS_ENGINE"):  # deepspeed: the same test under ZeRO-2
        for path in (one, two):
            cfg = body if path == two else yaml.safe_load(path.read_text())
            cfg["train"]["engine"].update(kind=engine, zero_stage=2)
            path.write_text(yaml.safe_dump(cfg))
    two.write_text(yaml.safe_dump(body))
    log_one, log_two = tmp_path / "one.log", tmp_path / "two.log"
    a, b = start(one, log_one), torchrun(two, log_two)
    try:
        wait_for_seq(tmp_path / "ckpt-two", 1, b, log_two)
        assert await committed(bus, "trainer-two", until=2) == 2
        # Rank 1 is frozen while it waits for the next batch, rank 0 takes batch 2 and starts it,
        # and rank 1 dies: the group stops within seconds, batch 2 neither checkpointed nor committed.
        rank1 = int(wait_for_line(log_two, r"rank 1 of 2 \(pid (\d+)\)", b).group(1))
        os.kill(rank1, signal.SIGSTOP)
        await publish(bus, store, tiny_policy, range(2, 4))
        wait_for_line(log_two, r"rank 0: batch batch-2 \(seq 2\) to 2 ranks", b)
        time.sleep(0.5)
        os.kill(rank1, signal.SIGKILL)
        killed = time.monotonic()
        b.wait(timeout=60)
        stopped_s = time.monotonic() - killed
        assert b.returncode != 0
        assert stopped_s < 15.0, f"the group took {stopped_s:.1f} s to stop"
        print(f"the group stopped {stopped_s:.2f} s after rank 1 was killed")
        assert read_state(latest_checkpoint(tmp_path / "ckpt-two")).seq == 1
        assert await committed(bus, "trainer-two") == 2

        # The restart, as `dart up` does it: `dart train` with `ranks: 2` starts itself under torchrun.
        body["train"]["ranks"] = 2
        (tmp_path / "two-ranks.yaml").write_text(yaml.safe_dump(body))
        b = start(tmp_path / "two-ranks.yaml", log_two)  # both ranks resume from step 2 and redo batch 2
        wait_for_seq(tmp_path / "ckpt-two", 3, b, log_two)
        wait_for_seq(tmp_path / "ckpt-one", 3, a, log_one)
    finally:
        stop(a)
        stop(b)
    # torchrun exits 1 on SIGTERM whatever its workers do; they stop cleanly: rank 1 on rank 0's word.
    assert "starting 2 trainer ranks" in log_two.read_text()
    restarted = log_two.read_text().split("ready at step 2", 1)[1]
    assert "rank 1: stopped by rank 0" in restarted, restarted[-3000:]
    assert not re.search(r"\[rank\d\]: Traceback", restarted), restarted[-3000:]
    assert len(re.findall(r"rank [01] of 2 \(pid \d+\) ready at step 2, version 2", log_two.read_text())) == 2
    assert await committed(bus, "trainer-two", until=4) == 4

    final_one, final_two = latest_checkpoint(tmp_path / "ckpt-one"), latest_checkpoint(tmp_path / "ckpt-two")
    assert read_state(final_one) == read_state(final_two)
    assert (read_state(final_two).step, read_state(final_two).seq, read_state(final_two).version) == (4, 3, 4)
    assert (final_two / "deepspeed").is_dir() == (os.environ.get("DART_TEST_RANKS_ENGINE") == "deepspeed")
    w1, w2 = load_file(final_one / "model.safetensors"), load_file(final_two / "model.safetensors")
    assert w1.keys() == w2.keys()
    diff = max(float((w1[k] - w2[k]).abs().max()) for k in w1)
    moved = max(float((w1[k] - tiny_policy.model.state_dict()[k]).abs().max()) for k in w1)
    # Float summation order differs (shards, then an all-reduce) and AdamW's normalised steps carry
    # that to ~1e-5 on coordinates whose gradient nearly cancels; a wrong shard, mask or scale
    # moves weights by the size of the update itself (~4e-3).
    assert diff <= 5e-5 and diff < 0.02 * moved, (diff, moved)
    print(f"two ranks vs one: max |w2 - w1| = {diff:.3g} (the update moved weights by up to {moved:.3g})")

    # Every batch trained once by the two-rank trainer, on both ranks' shards of the same samples.
    steps = [e for e in await events_of(bus, bus.topics.metrics, "trainer-two") if isinstance(e, TrainStepCompleted)]
    assert sorted(e.batch_id for e in steps) == [f"batch-{i}" for i in range(4)]
    reference = {e.batch_id: e for e in await events_of(bus, bus.topics.metrics, "trainer-one")
                 if isinstance(e, TrainStepCompleted)}
    for e in steps:
        shards = (e.metrics["rank/0/samples"], e.metrics["rank/1/samples"])
        assert shards == (6.0, 6.0)  # 12 steps, dealt by position
        assert sum(shards) == e.metrics["samples/kept"] == reference[e.batch_id].metrics["samples/kept"]
        assert e.num_samples == reference[e.batch_id].num_samples
        assert e.num_tokens == reference[e.batch_id].num_tokens
        assert abs(e.loss - reference[e.batch_id].loss) < 1e-5
        # the same gradient (AdamW would hide a wrong scale in the weights; the norm does not)
        assert abs(e.grad_norm - reference[e.batch_id].grad_norm) <= 1e-4 * reference[e.batch_id].grad_norm
    text = log_two.read_text()
    for seq in range(4):
        for rank in (0, 1):
            assert re.search(rf"rank {rank}: batch batch-{seq} \(seq {seq}\): 6 of 6 samples kept", text)


async def test_two_ranks_stop_at_max_updates_and_idle_ticking_until_stopped(bus, tiny_dir, tiny_policy, tmp_path) -> None:
    """One trainer loop for one rank or many: at ``max_updates`` rank 0 takes no more batches and
    idles, its ticks keeping rank 1 inside the process group's timeout, until it is stopped."""
    store = LocalBlobStore(tmp_path / "blobs")
    await publish(bus, store, tiny_policy, range(3))
    config = write_config(tmp_path / "capped.yaml", tiny_dir=tiny_dir, store=store, ckpt=tmp_path / "ckpt", bus=bus,
                          name="trainer-capped")
    body = yaml.safe_load(config.read_text())
    body["train"].update(max_updates=1, ranks=2)
    body["train"]["engine"]["dist_timeout_s"] = 8.0
    config.write_text(yaml.safe_dump(body))
    log = tmp_path / "capped.log"
    proc = start(config, log)
    try:
        wait_for_seq(tmp_path / "ckpt", 0, proc, log)
        # Longer than the group's timeout: rank 1 waits on ticks alone; an uncapped trainer would
        # meanwhile take batches 1 and 2, which are on the topic.
        time.sleep(12.0)
        assert proc.poll() is None, "a capped trainer idles (a supervisor would restart one that exits)"
    finally:
        stop(proc)
    state = read_state(latest_checkpoint(tmp_path / "ckpt"))
    assert (state.step, state.seq) == (1, 0)
    text = log.read_text()
    assert "max_updates=1 done: taking no more batches" in text
    assert "rank 1: stopped by rank 0" in text, text[-3000:]
    assert await committed(bus, "trainer-capped", until=1) == 1
