"""Checkpoints a killed trainer resumes from exactly: weights, optimiser, RNG and the batch position.

Layout under ``checkpoint_dir``::

    step-00000012/
        model.safetensors   full HF state_dict (also the published weights blob)
        config.json         HF model config
        model.safetensors.chunks  its chunk list: its blob address is this file's sha256
        SHA256SUMS          the blob addresses of both, hashed as written (published by link, unread)
        optimizer.pt        torch engine: AdamW state   | deepspeed/  (DeepSpeed engine state)
        rng.pt              python, numpy, torch (and CUDA) RNG states (tensors and numbers only)
        state.json          TrainState: step, version, last consumed batch (seq, batch_id)
    latest                  name of the newest checkpoint (for people; the loader trusts the dirs)

Every update writes a checkpoint, but only every N-th is **full** (the trainer's
``full_checkpoint_every``): the others are **weights only**, without ``optimizer.pt`` /
``deepspeed/`` and ``rng.pt`` (a 7B model's AdamW state is 28 GiB; its weights 16.6 GB). A
weights-only checkpoint is still the durable home of its version's files (they are published
from it by hard link), and still says how far training got; a restart resumes from the newest
*full* one (:func:`latest_full_checkpoint`), drops the weights-only ones after it and trains the
batches after it again. The rename is the commit: ``rng.pt`` is in a ``step-*`` directory only
if everything a full checkpoint holds is (:func:`is_full`).

A checkpoint is written into ``.tmp-*`` and renamed into place only when every file is on
disk (fsynced), so a ``step-*`` directory is always complete: a crash mid-write leaves a
``.tmp-*`` directory that the next save removes.
"""

from __future__ import annotations

import json
import os
import pickle
import random
import re
import shutil
import uuid
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Self

import numpy as np
import torch

from dart.blobs import fsync_dir
from dart.errors import ConfigError, DecodeError

STATE_FILE = "state.json"
RNG_FILE = "rng.pt"
RNG_FORMAT = "dart.rng.v2"
STATE_FORMAT = "dart.trainer.v1"
_STEP_DIR = re.compile(r"^step-(\d{8,})$")


@dataclass(frozen=True, kw_only=True)
class TrainState:
    """Where training stands; saved in every checkpoint."""

    step: int = 0
    """Updates applied so far."""
    version: int = 0
    """Newest policy version number assigned (0 = the initial weights)."""
    weights_are_version: bool = True
    """Whether the current weights are exactly ``version`` (False between publications)."""
    seq: int = -1
    """``seq`` of the last batch consumed (applied or skipped); batches with seq <= this are skipped."""
    batch_id: str | None = None
    """Id of that batch."""

    def to_json(self) -> str:
        return json.dumps({"format": STATE_FORMAT, **asdict(self)}, indent=1, sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, text: str) -> Self:
        try:
            body = json.loads(text)
            if body.pop("format", None) != STATE_FORMAT:
                raise ValueError(f"format is not {STATE_FORMAT}")
            return cls(**body)
        except (ValueError, TypeError) as exc:
            raise DecodeError(f"not a trainer state: {exc}") from exc

    def consumed(self, seq: int, batch_id: str) -> Self:
        return replace(self, seq=seq, batch_id=batch_id)

    def updated(self, *, publish: bool) -> Self:
        """After one update; ``publish`` assigns the next version number to the new weights."""
        return replace(self, step=self.step + 1, version=self.version + int(publish), weights_are_version=publish)


def rng_state() -> dict[str, Any]:
    """Every RNG the trainer draws from, as tensors, numbers and lists only.

    NOTE: no numpy arrays or other objects: ``rng.pt`` is loaded with ``weights_only=True``, so a
    crafted checkpoint can hold data but never a callable that unpickling would run.
    """
    version, internal, gauss_next = random.getstate()
    name, keys, pos, has_gauss, cached = np.random.get_state()
    state: dict[str, Any] = {
        "format": RNG_FORMAT,
        "python": {"version": version, "state": torch.tensor(internal, dtype=torch.int64), "gauss_next": gauss_next},
        "numpy": {"name": name, "keys": torch.from_numpy(np.asarray(keys, dtype=np.int64)), "pos": int(pos),
                  "has_gauss": int(has_gauss), "cached_gaussian": float(cached)},
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state: dict[str, Any]) -> None:
    try:
        if state.get("format") != RNG_FORMAT:
            raise ValueError(f"format is not {RNG_FORMAT}")
        py, npy = state["python"], state["numpy"]
        random.setstate((int(py["version"]), tuple(int(x) for x in py["state"].tolist()), py["gauss_next"]))
        np.random.set_state((str(npy["name"]), npy["keys"].numpy().astype(np.uint32), int(npy["pos"]),
                             int(npy["has_gauss"]), float(npy["cached_gaussian"])))
        torch.set_rng_state(state["torch"])
    except (KeyError, TypeError, ValueError, AttributeError, RuntimeError) as exc:
        raise DecodeError(f"not a dart RNG state: {exc}") from exc
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def step_dir_name(step: int) -> str:
    return f"step-{step:08d}"


def checkpoints(root: Path) -> list[Path]:
    """Complete checkpoints under ``root``, oldest first."""
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir() if p.is_dir() and (m := _STEP_DIR.match(p.name))]
    return [p for _, p in sorted(found)]


def latest_checkpoint(root: Path) -> Path | None:
    """The newest checkpoint, full or weights only (the newest weights and training position)."""
    found = checkpoints(root)
    return found[-1] if found else None


def is_full(checkpoint: Path) -> bool:
    """Whether ``checkpoint`` holds the optimiser and RNG state too (a restart can resume from it)."""
    return (checkpoint / RNG_FILE).is_file()


def latest_full_checkpoint(root: Path) -> Path | None:
    """The newest full checkpoint: where a restart resumes (None: a fresh start). ConfigError when
    ``root`` holds checkpoints but no full one (pruned by hand?): a fresh start would write over them."""
    found = checkpoints(root)
    full = next((p for p in reversed(found) if is_full(p)), None)
    if found and full is None:
        raise ConfigError(f"train.checkpoint_dir {root} holds {len(found)} weights-only checkpoints and no full one "
                          f"({RNG_FILE} and the optimiser state): nothing to resume from; move them away to start afresh")
    return full


def discard_after(root: Path, checkpoint: Path) -> list[str]:
    """Remove the checkpoints newer than ``checkpoint`` (weights-only ones a resume from it trains
    again) and point ``latest`` at it; returns the names removed. Their versions' blobs are
    hard links or copies in the blob store, not these files: removing them loses no version."""
    found = checkpoints(root)
    newer = found[found.index(checkpoint) + 1:]
    for old in newer:
        shutil.rmtree(old)
    if newer:
        fsync_dir(root)
        _write_latest(root, checkpoint.name)
    return [p.name for p in newer]


def _write_latest(root: Path, name: str) -> None:
    latest_tmp = root / f".tmp-latest-{uuid.uuid4().hex[:8]}"
    latest_tmp.write_text(name + "\n")
    os.replace(latest_tmp, root / "latest")


def prune(root: Path, *, keep: int, keep_full: int) -> None:
    """Delete every checkpoint but the newest ``keep`` and the newest ``keep_full`` full ones."""
    found = checkpoints(root)
    kept = set(found[-keep:]) | set([p for p in found if is_full(p)][-keep_full:])
    for old in found:
        if old not in kept:
            shutil.rmtree(old, ignore_errors=True)


def read_state(checkpoint: Path) -> TrainState:
    return TrainState.from_json((checkpoint / STATE_FILE).read_text())


def _fsync_tree(directory: Path) -> None:
    for path in sorted(directory.rglob("*")):
        if path.is_file():
            with open(path, "rb") as fh:
                os.fsync(fh.fileno())
    fsync_dir(directory)




def commit_checkpoint(root: Path, state: TrainState, write: Any, *, keep: int, full: bool = True,
                      keep_full: int | None = None) -> Path:
    """Write a checkpoint atomically: ``write(tmp_dir)`` fills in the model files (and, when
    ``full``, the engine state), this adds the state and, when ``full``, the RNG, fsyncs, renames
    the directory into place, updates ``latest`` and prunes all but the newest ``keep`` and the
    newest ``keep_full`` full ones (default: ``keep``). Returns the checkpoint directory."""
    root.mkdir(parents=True, exist_ok=True)
    for stale in root.glob(".tmp-*"):
        shutil.rmtree(stale, ignore_errors=True)
    final = root / step_dir_name(state.step)
    tmp = root / f".tmp-{final.name}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    write(tmp)
    if full:
        torch.save(rng_state(), tmp / RNG_FILE)
    (tmp / STATE_FILE).write_text(state.to_json())
    _fsync_tree(tmp)
    if final.exists():  # the same step written again after a crash: the new one wins
        shutil.rmtree(final)
    os.rename(tmp, final)
    fsync_dir(root)
    _write_latest(root, final.name)
    prune(root, keep=keep, keep_full=keep if keep_full is None else keep_full)
    return final


def load_rng(checkpoint: Path) -> None:
    """Restore the RNGs saved in ``checkpoint``. A file that is not plain tensors and numbers
    (an older checkpoint's pickled numpy state, or a crafted pickle) is a DecodeError: the
    unpickler refuses it before any of it runs."""
    path = checkpoint / RNG_FILE
    try:
        state = torch.load(path, weights_only=True)
    except pickle.UnpicklingError as exc:
        raise DecodeError(f"{path}: refused to unpickle (only tensors and numbers are allowed; a checkpoint "
                          f"written before {RNG_FORMAT} cannot be resumed exactly): {exc}") from exc
    if not isinstance(state, dict):
        raise DecodeError(f"{path}: not a dart RNG state (got {type(state).__name__})")
    restore_rng(state)
