"""``dart replay decision`` and ``dart replay update``: re-run a logged decision or trainer update from a
finished run's archive (``dart replay store``, the projection rebuilt from the log, is :mod:`dart.data.replay`).

Everything comes from the run directory: the observation and the action the rollout worker
sent (from the archive), the weights of the version that acted (``WeightsPublished`` in the
archive, its blob in ``RUN_DIR/blobs``; version 0 is the run's initial model), the screenshots
(blobs) and the prompt settings (``RUN_DIR/config/rollout-0.yaml``). The policy then answers
the same observation three ways:

- **same sampling** (the logged temperature, top-p and seed): the rollout worker's per-request
  generator is seeded from the logged seed, so on the same CPU build the text is identical;
  an imported step (``mode="experience"``: an oracle's or another run's experience) was never
  sampled, so there is nothing to reproduce: it is named as imported, never as DIFFERS;
- **greedy**: what the policy would say at temperature 0;
- **re-scored**: the logged response tokens under the policy in one forward pass; the largest
  difference from the logged per-token log-probs says whether the weights and prompt are the
  ones that acted (differences of 1e-6 are float noise; whole nats mean a different prompt or
  different weights).
"""

from __future__ import annotations

import asyncio
import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dart.agent.model import load_policy, load_policy_with, score_response
from dart.agent.prompt import blob_image_loader, build_messages, encode_prompt, prompt_hash
from dart.agent.weight_format import WEIGHTS_FILE, check_version_digest, weights_blob
from dart.blobs import LocalBlobStore, chunks
from dart.config import build, load_yaml
from dart.data.experience import EXPERIENCE_MODE
from dart.errors import ConfigError
from dart.events import ActionChosen, BatchAssembled, ObservationEmitted, Sampling, WeightsPublished, decode
from dart.events.manifest import BatchManifest, PromptContext
from dart.log import ArchiveError, list_segments, read_partition
from dart.rollout.config import RolloutWorkerConfig
from dart.rollout.engine import GenerateRequest
from dart.rollout.hf_engine import HFEngine
from dart.rundir import RunInfo
from dart.train.checkpoint import checkpoints, is_full, step_dir_name
from dart.train.config import TrainerConfig
from dart.train.trainer import Trainer


@dataclass(frozen=True, slots=True)
class DecisionReplay:
    rollout_id: str
    step_index: int
    policy_version: int
    logged_text: str
    same_sampling_text: str
    greedy_text: str
    max_logprob_diff: float
    """Largest |re-scored - logged| per-token log-prob (nats) over the logged response."""
    tokens: int
    prompt_equal: bool
    """The rebuilt prompt's token hash equals the logged ``prompt_hash``."""
    imported_from: str = ""
    """The engine of an imported step (``dart log`` experience, an oracle): nothing was sampled."""

    @property
    def identical(self) -> bool:
        return self.same_sampling_text == self.logged_text

    @property
    def reproduced(self) -> bool:
        """The command's verdict: a sampled decision came out the same; an imported one has no
        sampling to reproduce and passes."""
        return bool(self.imported_from) or self.identical

    def text(self) -> str:
        def show(s: str) -> str:
            return repr(s if len(s) <= 160 else s[:157] + "...")

        if self.imported_from:
            verdict = f"not sampled: imported from {self.imported_from}, the policy's own answer for comparison"
        else:
            verdict = "IDENTICAL" if self.identical else "DIFFERS"
        return "\n".join([
            f"decision {self.rollout_id} step {self.step_index}, policy version {self.policy_version}",
            f"  logged                 {show(self.logged_text)}",
            f"  same sampling (seeded) {show(self.same_sampling_text)}  {verdict}",
            f"  greedy                 {show(self.greedy_text)}  "
            f"{'same as logged' if self.greedy_text == self.logged_text else 'differs from logged'}",
            f"  prompt                 {'rebuilt token for token (hash equal)' if self.prompt_equal else 'DIFFERS'}",
            f"  re-scored log-probs    max |diff| {self.max_logprob_diff:.2e} nats over {self.tokens} tokens",
        ])


def _find(log_dir: Path, rollout_id: str, step: int) -> tuple[ObservationEmitted, ActionChosen]:
    obs = act = None
    for (topic, _part), segs in sorted(list_segments(log_dir).items()):
        if not topic.endswith((".env.observations", ".rollout.actions")):
            continue
        for rec in read_partition(segs):
            if rec["key"] != rollout_id.encode() or rec["event_type"] not in ("ObservationEmitted", "ActionChosen"):
                continue
            event = decode(rec["value"])
            if getattr(event, "step_index", None) != step:
                continue
            if isinstance(event, ObservationEmitted):
                obs = event
            elif isinstance(event, ActionChosen):
                act = event
    if obs is None or act is None:
        raise ArchiveError(f"{log_dir}: no {'observation' if obs is None else 'action'} for rollout {rollout_id} "
                           f"step {step} in the archive")
    return obs, act


def _weights_event(log_dir: Path, version: int) -> WeightsPublished | None:
    for (topic, _part), segs in sorted(list_segments(log_dir).items()):
        if topic.endswith(".weights"):
            for rec in read_partition(segs):
                event = decode(rec["value"])
                if isinstance(event, WeightsPublished) and event.version == version:
                    return event
    return None


def load_version(log_dir: Path, store: LocalBlobStore, model_dir: Path, version: int) -> Any:
    """The policy of ``model_dir`` with the weights the run published as ``version`` (its
    ``WeightsPublished`` in the archive ``log_dir``, its bytes in ``store``)."""
    if version == 0:
        return load_policy(model_dir)
    event = _weights_event(log_dir, version)
    if event is None:
        raise ArchiveError(f"{log_dir}: version {version} was never published in this run")
    check_version_digest(event)
    return load_policy_with(model_dir, store.get(weights_blob(event).digest))


def replay_decision(run: RunInfo, rollout_id: str, step: int, *, worker_config: Path | None = None) -> DecisionReplay:

    # The run's parts are each named once (the config, the archive, the blob store) and passed on
    # under that name; the blob store comes last, as opening it makes its directory.
    worker_config = worker_config or run.root / "config" / "rollout-0.yaml"
    if not worker_config.exists():
        raise ConfigError(f"{worker_config} does not exist: name the rollout worker's config with --worker-config")
    cfg = build(RolloutWorkerConfig, load_yaml(worker_config).get("rollout", {}), path="rollout")
    log_dir = run.log
    obs, act = _find(log_dir, rollout_id, step)
    store = LocalBlobStore(run.blobs)
    policy = load_version(log_dir, store, Path(cfg.model), act.policy_version)
    ctx = PromptContext.from_observation(obs)
    messages, images = build_messages(ctx, blob_image_loader(store), cfg.prompt)
    sampling = act.sampling
    imported = obs.mode == EXPERIENCE_MODE  # `dart log` experience or an oracle's step: nothing was sampled
    if imported:  # its logged sampling is NO_SAMPLING (max_new_tokens 0): answer as long as the logged response
        sampling = dataclasses.replace(sampling, max_new_tokens=max(len(act.response_token_ids), 1))
    greedy = dataclasses.replace(sampling, temperature=0.0)

    async def answer(sampling: Sampling) -> str:
        engine = HFEngine(policy, cfg.hf)
        await engine.start()
        try:
            gen = await engine.generate(GenerateRequest(messages=messages, images=images, sampling=sampling))
        finally:
            await engine.close()
        return gen.text

    same = asyncio.run(answer(sampling))
    greedy_text = asyncio.run(answer(greedy))
    inputs = encode_prompt(policy.tokenizer, policy.image_processor, messages, images)
    logprobs, _ = score_response(policy.model, inputs, list(act.response_token_ids))
    diff = max((abs(a - b) for a, b in zip(logprobs, act.logprobs, strict=False)), default=0.0)
    return DecisionReplay(rollout_id, step, act.policy_version, act.response_text, same, greedy_text, diff,
                          len(act.response_token_ids), prompt_hash(inputs.token_ids()) == act.prompt_hash,
                          imported_from=(act.engine or "an import") if imported else "")


# ---------------------------------------------------------------- one trainer update


@dataclass(frozen=True, slots=True)
class UpdateReplay:
    version: int
    train_step: int
    batch_id: str
    logged_digest: str
    replayed_digest: str
    from_checkpoint: str

    @property
    def identical(self) -> bool:
        return self.logged_digest == self.replayed_digest

    def text(self) -> str:
        verdict = ("bit-exact: the same weights" if self.identical else
                   "DIFFERS (same batch, same checkpoint: a nondeterministic kernel, another torch build or "
                   "thread count than the run's trainer)")
        return "\n".join([
            f"update to version {self.version} (step {self.train_step}, batch {self.batch_id}) "
            f"re-run from {self.from_checkpoint}",
            f"  logged   model.safetensors sha256 {self.logged_digest}",
            f"  replayed model.safetensors sha256 {self.replayed_digest}",
            f"  {verdict}",
        ])


def _batch_event(log_dir: Path, batch_id: str) -> Any:

    for (topic, _part), segs in sorted(list_segments(log_dir).items()):
        if topic.endswith(".train.batches"):
            for rec in read_partition(segs):
                event = decode(rec["value"])
                if isinstance(event, BatchAssembled) and event.batch_id == batch_id:
                    return event
    raise ArchiveError(f"{log_dir}: batch {batch_id} is not in the archive")


def replay_update(run: RunInfo, version: int, *, trainer_config: Path | None = None) -> UpdateReplay:
    """Re-run the trainer update that made ``version`` from the checkpoint before it and its logged
    batch; compare the resulting weights' digest with the published one."""
    import shutil
    import tempfile

    config = trainer_config or run.root / "config" / "trainer.yaml"
    if not config.exists():
        raise ConfigError(f"{config} does not exist: name the trainer's config with --trainer-config")
    cfg = build(TrainerConfig, load_yaml(config).get("train", {}), path="train")
    event = _weights_event(run.log, version)
    if event is None or event.batch_id is None:
        raise ArchiveError(f"{run.log}: no update published version {version}")
    before = Path(cfg.checkpoint_dir) / step_dir_name(event.train_step - 1)
    if not before.is_dir():
        kept = [p.name for p in checkpoints(Path(cfg.checkpoint_dir))]
        raise ConfigError(f"the checkpoint before version {version} ({before.name}) was pruned: the trainer keeps "
                          f"the newest train.keep_checkpoints={cfg.keep_checkpoints} ({', '.join(kept) or 'none'}); "
                          f"raise it to replay older updates")
    if not is_full(before):
        raise ConfigError(f"the checkpoint before version {version} ({before.name}) holds weights only "
                          f"(train.full_checkpoint_every={cfg.full_checkpoint_every}): replay a version made right "
                          "after a full checkpoint, or run with train.full_checkpoint_every=1 to replay any")
    blobs = LocalBlobStore(run.blobs)
    batch = _batch_event(run.log, event.batch_id)
    manifest = BatchManifest.from_bytes(blobs.get(batch.manifest_digest))
    work = Path(tempfile.mkdtemp(prefix="dart-replay-update-"))
    try:
        shutil.copytree(before, work / before.name)
        (work / "latest").write_text(before.name + "\n")
        trainer = Trainer(dataclasses.replace(cfg, checkpoint_dir=work, keep_checkpoints=1000), blobs)
        trainer.update(trainer.prepare(manifest))
        after = trainer.checkpoint()
        replayed = chunks.list_address(chunks.hash_file(after / WEIGHTS_FILE))   # the weights' blob address
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return UpdateReplay(version, event.train_step, event.batch_id, weights_blob(event).digest, replayed, before.name)

