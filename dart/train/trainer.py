"""The trainer service: consume batches, update the policy, checkpoint, publish, report.

``serve_batches`` is the whole loop (one rank's, or rank 0's of several: :mod:`dart.train.ranks`);
``Trainer`` holds the model, the engine and the training position and does the work of each line.
A batch's effect is durable (a full checkpoint) before its offset is committed, so a trainer killed
at any point resumes with no batch lost or applied twice: it restores the newest full checkpoint,
batches with ``seq`` at or below its position are skipped, and those after it (uncommitted, so
delivered again) are trained again on the restored state. With ``full_checkpoint_every`` 1 that
is at most the batch in hand.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import functools
import logging
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from dart.agent.model import load_policy
from dart.agent.prompt import blob_image_loader
from dart.agent.weight_format import write_weights
from dart.blobs import BlobStore, open_store
from dart.bus import SLOW_FETCH_WAIT_MS, BusConfig, Consumer, Delivered, Producer, stop_on_signals
from dart.events import BatchAssembled, TrainStepCompleted, WeightsPublished
from dart.events.manifest import BatchManifest
from dart.train.batch import Dropped, ModelBatch, micro_batches, prepare_samples
from dart.train.checkpoint import (
    TrainState,
    commit_checkpoint,
    discard_after,
    latest_full_checkpoint,
    load_rng,
    read_state,
)
from dart.train.config import TrainerConfig
from dart.train.engine import Engine, ReferencePolicy, build_engine
from dart.train.freeze import freeze_vision_tower
from dart.train.staging import HostStaging
from dart.train.update import UpdateResult, apply_update, step_metrics
from dart.train.weight_publish import weights_published
from dart.train.weight_send import WeightTransfer, make_transfer

log = logging.getLogger(__name__)


class TrainerHalted(BaseException):
    """An update failed after the model may have changed: the process must stop and resume
    from its last checkpoint. A BaseException on purpose: the bus consumer must neither retry
    the batch on the half-updated model, nor dead-letter it, nor commit its offset."""


@dataclass(frozen=True, kw_only=True)
class Prepared:
    """A batch whose prompts were rebuilt and checked, split into micro-batches."""

    manifest: BatchManifest
    batches: list[ModelBatch]
    dropped: list[Dropped]
    adv_B: torch.Tensor
    prepare_s: float


class Trainer:
    """The policy being trained and where training stands; resumes from ``cfg.checkpoint_dir``."""

    def __init__(self, cfg: TrainerConfig, blobs: BlobStore) -> None:
        self.cfg = cfg
        self.blobs = blobs
        if cfg.engine.threads:
            torch.set_num_threads(cfg.engine.threads)
        policy = load_policy(cfg.model, device="cpu", dtype=cfg.engine.dtype)
        self.tokenizer, self.image_processor = policy.tokenizer, policy.image_processor
        self.pad_id = policy.pad_token_id
        self.load_image = blob_image_loader(blobs)
        self.staging = HostStaging()
        """Where each checkpoint's weights leave the engine: one buffer, pinned on a GPU host, reused."""
        # The KL reference is the initial policy, also after a resume (copied before any update).
        ref_model = copy.deepcopy(policy.model) if cfg.loss.kl_coef > 0 else None
        if cfg.freeze_vision:  # after the copy: the reference keeps computing its own features
            log.info("vision tower frozen: %d parameters not trained", freeze_vision_tower(policy.model))
        self.engine = self.build_engine(policy.model)
        self.ref = ReferencePolicy(ref_model, self.engine.device, getattr(torch, cfg.engine.dtype)) \
            if ref_model is not None else None
        if not cfg.clip_acts:
            log.info("one optimiser step per batch (ppo_epochs 1, ppo_minibatches 1): the PPO ratio is 1, so "
                     "the clip range (eps_low %g, eps_high %g) changes nothing", cfg.loss.eps_low, cfg.loss.eps_high)
        self.durable = True
        """Whether every update so far is in a full checkpoint (a restart would redo none of them)."""
        self.last_checkpoint = self.find_checkpoint()
        if self.last_checkpoint is not None:
            self.engine.load_state(self.last_checkpoint)
            load_rng(self.last_checkpoint)
            self.state = read_state(self.last_checkpoint)
            log.info("resumed from %s: step %d, version %d, last batch seq %d", self.last_checkpoint,
                     self.state.step, self.state.version, self.state.seq)
        else:
            random.seed(cfg.seed)
            np.random.seed(cfg.seed)
            torch.manual_seed(cfg.seed)
            self.state = TrainState()
            self.checkpoint()  # version 0 = the initial weights, published from this checkpoint

    def build_engine(self, model: torch.nn.Module) -> Engine:
        return build_engine(model, self.cfg.optim, self.cfg.engine)

    def find_checkpoint(self) -> Path | None:
        """The checkpoint to resume from (None: a fresh start): the newest full one. The weights-only
        checkpoints after it are removed: the batches that made them are trained again."""
        found = latest_full_checkpoint(self.cfg.checkpoint_dir)
        if found is not None and (dropped := discard_after(self.cfg.checkpoint_dir, found)):
            log.info("resuming from the full checkpoint %s: weights-only %s removed, their batches are "
                     "trained again", found.name, ", ".join(dropped))
        return found

    def apply(self, prepared: Prepared) -> UpdateResult:
        """The update itself (:func:`dart.train.update.apply_update`)."""
        return apply_update(self.engine, prepared.batches, self.cfg.loss, self.ref, epochs=self.cfg.ppo_epochs,
                            minibatches=self.cfg.ppo_minibatches)

    @functools.cached_property
    def transfer(self) -> WeightTransfer:
        """How published versions travel (``cfg.transfer``); made on the first publication."""
        return make_transfer(self.cfg.transfer)

    def already_consumed(self, event: BatchAssembled) -> bool:
        if event.seq <= self.state.seq:
            log.info("batch %s (seq %d) is at or before the checkpointed seq %d: skipped", event.batch_id,
                     event.seq, self.state.seq)
            return True
        return False

    def prepare(self, manifest: BatchManifest) -> Prepared:
        """Advantages, rebuilt prompts (mismatches dropped and logged), micro-batches."""
        start = time.perf_counter()
        samples, dropped = prepare_samples(manifest, tokenizer=self.tokenizer,
                                           image_processor=self.image_processor, load_image=self.load_image,
                                           prompt_cfg=self.cfg.prompt, step_weight=self.cfg.loss.step_weight)
        for d in dropped:
            log.warning("batch %s: dropped step %d of %s (%s: %s)", manifest.batch_id, d.step_index,
                        d.rollout_id, d.reason, d.detail)
        batches = micro_batches(samples, size=self.cfg.engine.micro_batch_samples, pad_id=self.pad_id)
        adv_B = torch.tensor([s.advantage for s in samples], dtype=torch.float32)
        return Prepared(manifest=manifest, batches=batches, dropped=dropped, adv_B=adv_B,
                        prepare_s=time.perf_counter() - start)

    def update(self, prepared: Prepared) -> TrainStepCompleted | None:
        """Apply one update and return its report; None (and no update) when no sample is left."""
        manifest = prepared.manifest
        if not prepared.adv_B.numel():  # no kept sample (on any rank)
            log.warning("batch %s: no trainable sample (%d dropped): no update", manifest.batch_id,
                        len(prepared.dropped))
            self.state = self.state.consumed(manifest.seq, manifest.batch_id)
            return None
        result = self.apply(prepared)
        publish = (self.state.step + 1) % self.cfg.publish_every == 0
        self.state = self.state.updated(publish=publish).consumed(manifest.seq, manifest.batch_id)
        metrics = step_metrics(result, prepared.dropped, kept=prepared.adv_B.numel(),
                               adv_B=prepared.adv_B,
                               timings={"prepare": prepared.prepare_s, "update": result.duration_s,
                                        "step": prepared.prepare_s + result.duration_s})
        log.info("step %d (batch %s seq %d): loss %.4f kl %.4g tis %.3f grad %.3g, %d samples, %.0f tok/s",
                 self.state.step, manifest.batch_id, manifest.seq, metrics["loss/total"],
                 metrics.get("loss/kl", 0.0), metrics["tis/mean"], result.grad_norm, result.num_samples,
                 result.tokens_per_s)
        return TrainStepCompleted.new(
            run_id=self.cfg.run_id, producer=self.cfg.worker_id, step=self.state.step,
            policy_version=self.state.version, batch_id=manifest.batch_id, loss=metrics["loss/total"],
            kl=metrics.get("loss/kl", 0.0), entropy=metrics.get("entropy/mean", 0.0),
            clip_frac=metrics["clip/frac"], tis_mean=metrics["tis/mean"],
            logprob_mismatch=metrics["mismatch/abs"], grad_norm=result.grad_norm,
            num_samples=result.num_samples, num_tokens=result.num_tokens, duration_s=metrics["time/step_s"],
            tokens_per_s=result.tokens_per_s, metrics=metrics,
        )

    def full_due(self) -> bool:
        """Whether this update's checkpoint is a full one (every ``full_checkpoint_every``-th, and step 0)."""
        return self.state.step % self.cfg.full_checkpoint_every == 0

    def checkpoint(self, full: bool | None = None) -> Path:
        """Write the model and position, and when ``full`` (default: :meth:`full_due`) the optimiser
        and RNG, atomically (see ``dart.train.checkpoint``)."""
        full = self.full_due() if full is None else full

        def write(directory: Path) -> None:
            write_weights(self.engine.full_state_dict(self.staging), self.engine.policy.config.to_json_string(), directory)
            if full:
                self.engine.save_state(directory)

        self.last_checkpoint = commit_checkpoint(self.cfg.checkpoint_dir, self.state, write, full=full,
                                                 keep=self.cfg.keep_checkpoints, keep_full=self.cfg.keep_full_checkpoints)
        self.durable = full
        return self.last_checkpoint

    def make_durable(self) -> None:
        """On a clean stop: a full checkpoint unless the last one was, so a restart redoes nothing."""
        if not self.durable:
            self.checkpoint(full=True)

    def publish(self) -> WeightsPublished:
        """Store the current weights (from the newest checkpoint) and announce them as ``state.version``."""
        assert self.state.weights_are_version and self.last_checkpoint is not None
        blobs = self.transfer.publish(self.state.version, self.last_checkpoint, self.blobs)
        return weights_published(run_id=self.cfg.run_id, producer=self.cfg.worker_id, version=self.state.version,
                                 blobs=blobs, train_step=self.state.step, batch_id=self.state.batch_id)


class _Signalled(asyncio.Event):
    """Set by SIGTERM/SIGINT (``stop_on_signals`` calls ``stop``)."""

    def stop(self) -> None:
        self.set()


Step = Callable[[BatchAssembled, BatchManifest, bytes], Awaitable[TrainStepCompleted | None]]
"""One batch (its event, its manifest and the manifest's bytes): the update and its checkpoint; the
report to send (None: nothing to train on). Raises TrainerHalted once the policy may have changed."""
KeepAlive = Callable[[Callable[[], None]], AbstractAsyncContextManager[None]]
"""What runs beside the loop while it serves, given a function that stops the loop (the ranks'
ticks between batches); raising on exit halts the trainer."""
Durable = Callable[[], Awaitable[None]]
"""Makes the last update durable on a clean stop (a full checkpoint unless the last one was)."""


def halted(trainer: Trainer, event: BatchAssembled, exc: BaseException, where: str = "") -> TrainerHalted:
    return TrainerHalted(f"update on batch {event.batch_id} failed{where} ({type(exc).__name__}: {exc}); "
                         f"restart the trainer: it resumes from {trainer.last_checkpoint}")


async def serve(cfg: TrainerConfig, bus: BusConfig) -> None:
    """Run the trainer until SIGTERM/SIGINT; raises TrainerHalted when an update failed midway."""
    blobs = open_store(cfg.blobs)
    trainer = await asyncio.to_thread(Trainer, cfg, blobs)                     # resumes from its checkpoint

    async def step(event: BatchAssembled, manifest: BatchManifest, body: bytes) -> TrainStepCompleted | None:
        prepared = await asyncio.to_thread(trainer.prepare, manifest)           # nothing changed yet
        try:
            report = await asyncio.to_thread(trainer.update, prepared)          # the policy update
            if report is not None:
                await asyncio.to_thread(trainer.checkpoint)                     # durable before the commit
            return report
        except Exception as exc:
            raise halted(trainer, event, exc) from exc

    await serve_batches(trainer, bus, step)


@contextlib.asynccontextmanager
async def _nothing_beside(stop: Callable[[], None]) -> AsyncIterator[None]:
    yield


async def serve_batches(trainer: Trainer, bus: BusConfig, step: Step, keep_alive: KeepAlive = _nothing_beside,
                        durable: Durable | None = None) -> None:
    """The trainer service's loop, one rank's or rank 0's of several (:func:`dart.train.ranks.serve_ranks`):
    announce the weights, then for each batch the update (``step``), its version and its report,
    until SIGTERM/SIGINT; after ``max_updates`` it takes no more batches and idles until stopped.
    A clean stop (or the cap) first makes the last update durable (``durable``: by default
    :meth:`Trainer.make_durable`; several ranks write their parts together)."""
    cfg = trainer.cfg

    async def make_durable() -> None:
        await (durable() if durable is not None else asyncio.to_thread(trainer.make_durable))

    producer = Producer(bus, client_id=cfg.worker_id)
    if trainer.state.weights_are_version:                                      # v0, or re-announce after a crash
        await producer.send(await asyncio.to_thread(trainer.publish))

    def capped() -> bool:
        return 0 < cfg.max_updates <= trainer.state.step

    async def on_batch(delivered: Delivered) -> None:
        event = delivered.event
        if not isinstance(event, BatchAssembled) or trainer.already_consumed(event):
            return
        body = trainer.blobs.get(event.manifest_digest)                        # I/O
        manifest = BatchManifest.from_bytes(body)                              # bad -> dead letter, nothing ran
        report = await step(event, manifest, body)                             # the update, durable
        if report is None:
            return
        try:
            if trainer.state.weights_are_version:
                await producer.send(await asyncio.to_thread(trainer.publish))  # rollout workers swap
            await producer.send(report)
        except Exception as exc:
            raise halted(trainer, event, exc) from exc
        if capped():
            log.info("update %d of max_updates=%d done: taking no more batches, idle until stopped",
                     trainer.state.step, cfg.max_updates)
            consumer.stop()

    # A batch comes every several seconds: a fetch may wait long on the broker (a short wait is a
    # broker request 50 times a second for nothing).
    # A batch's offset is committed only once a full checkpoint holds its update: a restart from
    # the newest full checkpoint gets every batch after it delivered again.
    consumer = Consumer(bus, topics=[bus.topics.batches], group=cfg.group, handler=on_batch,
                        producer=producer, client_id=cfg.worker_id, fetch_max_wait_ms=SLOW_FETCH_WAIT_MS,
                        commit_when=lambda: trainer.durable)
    signalled = _Signalled()
    stop_on_signals(consumer, signalled)

    def stop() -> None:
        consumer.stop()
        signalled.stop()

    try:
        async with keep_alive(stop):
            if not capped():
                # After the capping update the consumer commits it and stops: the batches after stay
                # uncommitted in the log, for a run resumed with a higher cap.
                await consumer.run()
            await make_durable()                                              # a clean stop: a full checkpoint
            if capped():  # idle rather than exit: a supervisor restarts a service that exits
                await signalled.wait()
    finally:
        await asyncio.to_thread(producer.flush)
        if "transfer" in vars(trainer):  # tell a weights group's workers (they rejoin the next trainer)
            await asyncio.to_thread(trainer.transfer.close)
