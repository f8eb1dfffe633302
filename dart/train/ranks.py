"""The trainer on several ranks (torchrun, the deepspeed launcher): one consumer, every rank trains.

Rank 0 alone is the service: it is the only member of the consumer group on the batches topic,
commits offsets, and sends every event (weights, step reports). For each batch it broadcasts
the manifest to the other ranks; every rank then

1. computes the GRPO advantages over the whole manifest (cheap: rewards only),
2. rebuilds the prompts of its own shard of the samples (manifest positions ``i % world == rank``,
   screenshots read from the blob store by that rank alone),
3. shares which of them it kept (``all_gather_object``), so every rank knows the kept-sample
   count and order a one-rank trainer would have,
4. runs forward/backward on its micro-batches with each loss divided by the *global* count, and
5. steps: the torch engine all-reduces (sums) the gradients first (data parallel, DDP's
   semantics), DeepSpeed ZeRO reduces them itself (it averages, so each loss is multiplied by
   the world size). Every rank then holds the same weights.

The update therefore equals a one-rank update on the same batch up to float summation order.
Checkpoints are written by rank 0 (DeepSpeed's state by every rank, into the same directory);
a restart has rank 0 pick the checkpoint and every rank restore that one. A rank that exits
closes its connections and the others fail at their next collective (a hung rank: after
``engine.dist_timeout_s``); rank 0 then raises :class:`TrainerHalted` with the batch
uncommitted, torchrun stops the group, and a restart does the batch again.

While no batch is in hand rank 0 broadcasts a tick every few seconds, so the waiting ranks'
collective never runs into the process group's timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from dart.agent.weight_format import write_weights
from dart.blobs import open_store
from dart.bus import BusConfig
from dart.errors import ConfigError
from dart.events import BatchAssembled, TrainStepCompleted
from dart.events.manifest import BatchManifest
from dart.train.advantages import BatchError, group_advantages, length_weights
from dart.train.batch import Dropped, micro_batches, prepare_samples
from dart.train.checkpoint import commit_checkpoint
from dart.train.config import EngineConfig, TrainerConfig
from dart.train.engine import DeepSpeedEngine, Engine, TorchEngine
from dart.train.trainer import Prepared, Trainer, TrainerHalted, halted, serve_batches
from dart.train.update import UpdateResult, apply_update

log = logging.getLogger(__name__)

TICK = "tick"
STOP = "stop"
FULL = "full-checkpoint"
"""Rank 0 to the others on a clean stop: write a full checkpoint now (:meth:`Trainer.make_durable`)."""
BUCKET_ELEMENTS = 1 << 25
"""Gradient all-reduce bucket (32M elements: 128 MB in float32)."""


def world() -> tuple[int, int]:
    """(rank, world size) from the launcher's environment; (0, 1) without one."""
    return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))


def launch_command(ranks: int, argv: Sequence[str]) -> list[str]:
    """``python -m torch.distributed.run --standalone --nproc-per-node RANKS -m dart.train ARGV``."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}",
            "-m", "dart.train", *argv]


def init_group(engine: EngineConfig) -> None:
    """The default process group (gloo on CPU, NCCL on GPUs) with ``engine.dist_timeout_s``."""
    if dist.is_initialized():
        return
    cuda = engine.device != "cpu" and torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group("nccl" if cuda else "gloo", timeout=timedelta(seconds=engine.dist_timeout_s))


def all_reduce_gradients(params: Sequence[torch.nn.Parameter]) -> None:
    """Sum every parameter's gradient over the ranks, in flat buckets (a missing gradient is 0)."""
    grads = []
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        grads.append(p.grad)
    start = 0
    while start < len(grads):
        end, size = start, 0
        while end < len(grads) and (end == start or size + grads[end].numel() <= BUCKET_ELEMENTS):
            size += grads[end].numel()
            end += 1
        bucket = grads[start:end]
        flat = torch.cat([g.reshape(-1) for g in bucket])
        dist.all_reduce(flat)
        offset = 0
        for g in bucket:
            g.copy_(flat[offset: offset + g.numel()].view_as(g))
            offset += g.numel()
        start = end


class DataParallelEngine(TorchEngine):
    """The torch engine on one of several ranks: gradients summed over the ranks before the step
    (each rank's losses are already divided by the whole batch's sample count)."""

    def step(self) -> float:
        all_reduce_gradients([p for p in self.policy.parameters() if p.requires_grad])
        return super().step()


class RankedDeepSpeedEngine(DeepSpeedEngine):
    """DeepSpeed ZeRO on one of several ranks: it averages gradients over the ranks, so each loss
    (divided by the whole batch's sample count) is multiplied by the world size."""

    def backward(self, loss: torch.Tensor) -> None:
        super().backward(loss * dist.get_world_size())


def _broadcast(obj: Any = None) -> Any:
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def manifest_advantages(manifest: BatchManifest, step_weight: str) -> list[float]:
    """The advantages :func:`dart.train.batch.prepare_samples` gives, over the whole manifest."""
    rollout_ids = [s.rollout_id for s in manifest.samples]
    adv = group_advantages([s.reward for s in manifest.samples], [s.group_id for s in manifest.samples], rollout_ids)
    if step_weight == "trajectory":
        adv = adv * length_weights(rollout_ids)
    return [float(a) for a in adv.tolist()]


class RankTrainer(Trainer):
    """A :class:`Trainer` that is one rank of several; every method with collectives runs on every
    rank in the same order (rank 0 drives, :meth:`follow` mirrors)."""

    def __init__(self, cfg: TrainerConfig, blobs: Any, *, rank: int, world_size: int) -> None:
        if cfg.ppo_epochs * cfg.ppo_minibatches > 1:
            raise ConfigError("ranks > 1 takes one optimiser step per batch (ppo_epochs 1, ppo_minibatches 1)")
        self.rank, self.world_size = rank, world_size
        self.shard_sizes: list[int] = []
        super().__init__(cfg, blobs)
        log.info("rank %d of %d (pid %d) ready at step %d, version %d", rank, world_size, os.getpid(),
                 self.state.step, self.state.version)

    # ------------------------------------------------------------ construction and checkpoints

    def build_engine(self, model: torch.nn.Module) -> Engine:
        engine_cfg = self.cfg.engine
        if engine_cfg.device != "cpu" and torch.cuda.is_available():
            engine_cfg = replace(engine_cfg, device=f"cuda:{os.environ.get('LOCAL_RANK', '0')}")
        if engine_cfg.kind == "deepspeed":
            return RankedDeepSpeedEngine(model, self.cfg.optim, engine_cfg)
        return DataParallelEngine(model, self.cfg.optim, engine_cfg)

    def find_checkpoint(self) -> Path | None:
        """Rank 0's newest full checkpoint (it removes the weights-only ones after it), the same for every rank."""
        found = _broadcast(str(super().find_checkpoint() or "") if self.rank == 0 else None)
        return Path(found) if found else None

    def checkpoint(self, full: bool | None = None) -> Path:
        """Rank 0 commits the checkpoint; a full one's DeepSpeed state is written by every rank into it.
        Every rank decides ``full`` alike (from the step, or as rank 0 said)."""
        full = self.full_due() if full is None else full
        deepspeed = isinstance(self.engine, DeepSpeedEngine)
        gather = deepspeed and self.engine.stage == 3

        if self.rank == 0:
            def write(directory: Path) -> None:
                _broadcast(str(directory))
                write_weights(self.engine.full_state_dict(self.staging), self.engine.policy.config.to_json_string(), directory)
                if full:
                    self.engine.save_state(directory)
                dist.barrier()

            self.last_checkpoint = commit_checkpoint(self.cfg.checkpoint_dir, self.state, write, full=full,
                                                     keep=self.cfg.keep_checkpoints,
                                                     keep_full=self.cfg.keep_full_checkpoints)
            _broadcast(str(self.last_checkpoint))
        else:
            directory = Path(_broadcast())
            if gather:
                self.engine.full_state_dict()
            if full and deepspeed:
                self.engine.save_state(directory)
            dist.barrier()
            self.last_checkpoint = Path(_broadcast())
        self.durable = full
        return self.last_checkpoint

    # ------------------------------------------------------------ one batch

    def prepare(self, manifest: BatchManifest) -> Prepared:
        """This rank's micro-batches; the advantages, drops and sample count of the whole batch."""
        start = time.perf_counter()
        advantages = manifest_advantages(manifest, self.cfg.loss.step_weight)  # BatchError: same on every rank
        mine = [i for i in range(len(manifest.samples)) if i % self.world_size == self.rank]
        position = {(manifest.samples[i].rollout_id, manifest.samples[i].step_index): i for i in mine}
        shard = replace(manifest, samples=[manifest.samples[i] for i in mine])
        kept, dropped = prepare_samples(shard, tokenizer=self.tokenizer, image_processor=self.image_processor,
                                        load_image=self.load_image, prompt_cfg=self.cfg.prompt, advantages=False)
        kept = [replace(s, advantage=advantages[position[(s.rollout_id, s.step_index)]]) for s in kept]
        shared: list[Any] = [None] * self.world_size
        dist.all_gather_object(shared, ([position[(s.rollout_id, s.step_index)] for s in kept], dropped))
        # The kept samples of every rank in manifest order: a one-rank trainer's kept list.
        everyone = sorted(i for indices, _ in shared for i in indices)
        self.num_selected = len(everyone)
        self.shard_sizes = [len(indices) for indices, _ in shared]
        all_dropped: list[Dropped] = [d for _, ds in shared for d in ds]
        if self.rank == 0:
            for d in all_dropped:
                log.warning("batch %s: dropped step %d of %s (%s: %s)", manifest.batch_id, d.step_index,
                            d.rollout_id, d.reason, d.detail)
        batches = micro_batches(kept, size=self.cfg.engine.micro_batch_samples, pad_id=self.pad_id)
        if isinstance(self.engine, DeepSpeedEngine):
            batches = self._equal_counts(batches)
        log.info("rank %d: batch %s (seq %d): %d of %d samples kept on this rank, %d micro-batches",
                 self.rank, manifest.batch_id, manifest.seq, len(kept), len(mine), len(batches))
        adv_B = torch.tensor([advantages[i] for i in everyone], dtype=torch.float32)
        return Prepared(manifest=manifest, batches=batches, dropped=all_dropped, adv_B=adv_B,
                        prepare_s=time.perf_counter() - start)

    def _equal_counts(self, batches: list[Any]) -> list[Any]:
        """DeepSpeed reduces gradients in its backward hooks: every rank must run as many
        micro-batches. Short ranks repeat one of theirs with no selected sample (zero loss)."""
        count = torch.tensor([len(batches)])
        dist.all_reduce(count, op=dist.ReduceOp.MAX)
        missing = int(count) - len(batches)
        if missing and not batches:
            raise BatchError(f"rank {self.rank} has no sample of this batch: DeepSpeed needs one per rank")
        return batches + [replace(batches[0], step_mask_B=torch.zeros_like(batches[0].step_mask_B))] * missing

    def apply(self, prepared: Prepared) -> UpdateResult:
        """This rank's share of the update; the statistics summed over the ranks."""
        result = apply_update(self.engine, prepared.batches, self.cfg.loss, self.ref, num_samples=self.num_selected)
        shared: list[Any] = [None] * self.world_size
        dist.all_gather_object(shared, (result.stats, result.num_tokens))
        stats = shared[0][0]
        for other, _ in shared[1:]:
            stats = stats + other
        return replace(result, stats=stats, num_samples=self.num_selected,
                       num_tokens=sum(tokens for _, tokens in shared))

    def train_batch(self, body: bytes) -> TrainStepCompleted | None:
        """One batch on this rank (every rank calls it with the same manifest): the update and
        the checkpoint; the report (rank 0 sends it). None: nothing to train on."""
        manifest = BatchManifest.from_bytes(body)
        try:
            prepared = self.prepare(manifest)
        except BatchError as exc:  # the whole manifest is inconsistent: the same on every rank, nothing ran
            if self.rank == 0:
                raise
            log.error("rank %d: batch %s refused: %s", self.rank, manifest.batch_id, exc)
            return None
        report = self.update(prepared)
        if report is None:
            return None
        self.checkpoint()
        sizes = {f"rank/{r}/samples": float(n) for r, n in enumerate(self.shard_sizes)}
        return replace(report, metrics={**report.metrics, **sizes})

    def follow(self) -> None:
        """Ranks > 0: train on every batch rank 0 broadcasts until it says stop."""
        while True:
            message = _broadcast()
            if message == STOP:
                log.info("rank %d: stopped by rank 0", self.rank)
                return
            if message == FULL:
                self.checkpoint(full=True)
            elif message != TICK:
                self.train_batch(message)


class RankZero:
    """Rank 0's side of the collectives: each batch broadcast to every rank and trained on all of
    them (:meth:`step`), and ticks between batches (:meth:`ticking`) so the waiting ranks'
    collective never runs into the process group's timeout; one collective sequence at a time."""

    def __init__(self, trainer: RankTrainer) -> None:
        self.trainer = trainer
        self.collective = asyncio.Lock()
        self.last = time.monotonic()
        self.tick_s = min(5.0, trainer.cfg.engine.dist_timeout_s / 4)
        self.lost: list[BaseException] = []

    async def step(self, event: BatchAssembled, manifest: BatchManifest, body: bytes) -> TrainStepCompleted | None:
        """:data:`dart.train.trainer.Step` on every rank."""
        async with self.collective:
            try:
                log.info("rank 0: batch %s (seq %d) to %d ranks", event.batch_id, event.seq, self.trainer.world_size)
                await asyncio.to_thread(_broadcast, body)
                return await asyncio.to_thread(self.trainer.train_batch, body)
            except BatchError:  # the whole manifest is inconsistent: nothing ran on any rank
                raise
            except Exception as exc:
                raise halted(self.trainer, event, exc, where=f" on {self.trainer.world_size} ranks") from exc
            finally:
                self.last = time.monotonic()

    async def ticks(self, stop: Callable[[], None]) -> None:
        while True:
            await asyncio.sleep(self.tick_s / 2)
            if time.monotonic() - self.last >= self.tick_s and not self.collective.locked():
                async with self.collective:
                    try:
                        await asyncio.to_thread(_broadcast, TICK)
                    except RuntimeError as exc:  # a rank died between batches: stop, nothing uncommitted
                        self.lost.append(exc)
                        stop()
                        return
                    self.last = time.monotonic()

    async def make_durable(self) -> None:
        """:data:`dart.train.trainer.Durable` on every rank: a clean stop writes a full checkpoint
        (each rank its part) unless the last one was, so a restart redoes nothing."""
        if self.lost or self.trainer.durable:  # a rank gone: the restart resumes from the last full one
            return
        async with self.collective:
            await asyncio.to_thread(_broadcast, FULL)
            await asyncio.to_thread(self.trainer.checkpoint, True)
            self.last = time.monotonic()

    @contextlib.asynccontextmanager
    async def ticking(self, stop: Callable[[], None]) -> AsyncIterator[None]:
        """:data:`dart.train.trainer.KeepAlive`: ticks while the loop serves; STOP to every rank when
        it ends cleanly (not after a failure: the other ranks then fail at their next collective)."""
        ticker = asyncio.create_task(self.ticks(stop), name="rank-ticks")
        try:
            yield
        finally:
            ticker.cancel()
        if self.lost:
            raise TrainerHalted(f"a rank left the group between batches ({self.lost[0]}); restart the trainer")
        async with self.collective:
            try:
                await asyncio.to_thread(_broadcast, STOP)
            except RuntimeError as exc:  # a rank already gone: nothing to stop
                log.warning("rank 0: could not tell the other ranks to stop: %s", exc)


async def serve_ranks(cfg: TrainerConfig, bus: BusConfig) -> None:
    """The trainer service on this rank (see the module docstring): rank 0 runs the trainer's loop
    (:func:`dart.train.trainer.serve_batches`) with every batch trained on all ranks; the others
    follow it. Raises TrainerHalted when an update failed midway, a rank died included."""
    rank, world_size = world()
    init_group(cfg.engine)
    blobs = open_store(cfg.blobs)
    trainer = await asyncio.to_thread(RankTrainer, cfg, blobs, rank=rank, world_size=world_size)
    try:
        if rank == 0:
            zero = RankZero(trainer)
            await serve_batches(trainer, bus, zero.step, keep_alive=zero.ticking, durable=zero.make_durable)
            return
        # The launcher signals every rank at once: this one finishes what rank 0 broadcasts and
        # stops on its STOP (or when rank 0's connection closes).
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, log.info, "rank %d: signal received: waiting for rank 0's stop", rank)
        try:
            await asyncio.to_thread(trainer.follow)
        except Exception as exc:
            raise TrainerHalted(f"rank {rank}: {type(exc).__name__}: {exc}; restart the trainer") from exc
    finally:
        dist.destroy_process_group()
