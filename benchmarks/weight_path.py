"""A weight version from the trainer's memory to the rollout engine's, stage by stage, before and
after the streamed path, beside plain copies of the same bytes measured in the same run.

    PYTHONPATH=$PWD nice -n 10 .venv/bin/python benchmarks/weight_path.py [--params 1.0b] [--passes 5]

A state dict in Qwen2.5-1.5B's shapes (hidden 1536, MLP 8960, GQA 12/2 heads, vocab 151,936,
untied head; ``--params`` picks how many of its layers: 12 give 1.03 B parameters, 2.06 GB in
bfloat16), random values, is the trainer's weights; the stages a version goes through:

- ``host``: the state dict to host memory (the trainer's ``full_state_dict``);
- ``commit``: ``commit_checkpoint`` with the weights writer (write, digest, fsync, rename);
- ``publish``: ``put_weights`` of the committed checkpoint into an empty blob store (linked);
- ``fetch``: the rollout side's read of the blob with its verification;
- ``load``: the fetched tensors copied into the engine's (here: the source state's) tensors.

``before`` is the code as it was: a ``.to("cpu").clone()`` per tensor, the file written while one
thread computes its sha256, the store's plain sha256 blob, read back while one thread hashes it.
``after`` is the streamed path: ``HostStaging`` (one reused buffer, pinned where CUDA is: its
allocation is outside the timing, as the trainer makes it once), chunks written and hashed on
every core (``dart.blobs.chunks``), the chunked blob read once with every chunk verified on
every core. The references, same bytes, same pass: ``memcpy`` (tensor by tensor into one warm
buffer), ``write+fsync`` (one thread, no hashing), ``read`` (the page-cached file into a warm
buffer, no hashing), ``sha256`` (one core over the bytes in memory).

Memory: the source state plus at most one copy of it (the host copy is dropped before the fetch).
Median of interleaved passes with the spread; figures to ``--out`` (JSON).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from dart.agent.weight_format import (  # noqa: E402
    CONFIG_FILE,
    PUBLISHED_FILES,
    SUMS_FILE,
    WEIGHTS_FILE,
    safetensors_chunks,
    state_dict_from_buffer,
    write_weights,
    written_digests,
)
from dart.blobs import LocalBlobStore, chunks, write_hashed  # noqa: E402
from dart.train.checkpoint import TrainState, commit_checkpoint  # noqa: E402
from dart.train.staging import HostStaging  # noqa: E402
from dart.train.weight_publish import put_weights  # noqa: E402

QWEN_1_5B = {"hidden": 1536, "mlp": 8960, "heads": 12, "kv_heads": 2, "head_dim": 128, "vocab": 151_936}
LAYERS = {"tiny": 0, "0.5b": 3, "1.0b": 12, "2.0b": 33}
"""Layers of the 1.5B shape per size name (``tiny``: embeddings only, cut to 4,096 tokens, for tests)."""
STAGES = ("host", "commit", "publish", "fetch", "load")


def qwen_state(layers: int, *, vocab: int | None = None, dtype: torch.dtype = torch.bfloat16) -> dict[str, torch.Tensor]:
    """Random tensors under Qwen2.5's names and shapes (``layers`` decoder layers)."""
    h, m, kv = QWEN_1_5B["hidden"], QWEN_1_5B["mlp"], QWEN_1_5B["kv_heads"] * QWEN_1_5B["head_dim"]
    v = vocab or QWEN_1_5B["vocab"]
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (v, h)}
    for i in range(layers):
        p = f"model.layers.{i}."
        shapes.update({p + "self_attn.q_proj.weight": (h, h), p + "self_attn.q_proj.bias": (h,),
                       p + "self_attn.k_proj.weight": (kv, h), p + "self_attn.k_proj.bias": (kv,),
                       p + "self_attn.v_proj.weight": (kv, h), p + "self_attn.v_proj.bias": (kv,),
                       p + "self_attn.o_proj.weight": (h, h), p + "mlp.gate_proj.weight": (m, h),
                       p + "mlp.up_proj.weight": (m, h), p + "mlp.down_proj.weight": (h, m),
                       p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,)})
    shapes.update({"model.norm.weight": (h,), "lm_head.weight": (v, h)})
    gen = torch.Generator().manual_seed(0)
    return {k: (torch.randn(s, generator=gen) * 0.02).to(dtype) for k, s in shapes.items()}


# ---- before: the path as it was, kept callable here as the baseline ----

def host_before(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v.detach().to("cpu").contiguous().clone() for k, v in state.items()}


def write_before(state: dict[str, torch.Tensor], directory: Path) -> None:
    """``write_weights`` as it was: one writer, one sha256 thread, the plain digests in SHA256SUMS."""
    with open(directory / WEIGHTS_FILE, "wb", buffering=0) as fh:
        digests = {WEIGHTS_FILE: write_hashed(fh, safetensors_chunks(state))}
    with open(directory / CONFIG_FILE, "wb", buffering=0) as fh:
        digests[CONFIG_FILE] = write_hashed(fh, [b"{}"])
    (directory / SUMS_FILE).write_text("".join(f"{digests[n]}  {n}\n" for n in PUBLISHED_FILES))


def publish_before(store: LocalBlobStore, directory: Path) -> str:
    """``put_weights`` as it was: plain sha256 blobs, linked under the writer's digests."""
    known = written_digests(directory)
    digests = [store.put_file(directory / n, link=True, digest=known[n]) for n in PUBLISHED_FILES]
    return digests[0]


# ---- one pass of each side ----

class Passes:
    """Seconds of every stage of every side, pass by pass."""

    def __init__(self, state: dict[str, torch.Tensor], work: Path) -> None:
        self.state = state
        self.work = work
        self.nbytes = sum(t.numel() * t.element_size() for t in state.values())
        self.seconds: dict[str, dict[str, list[float]]] = {}

    def _note(self, side: str, stage: str, seconds: float) -> None:
        self.seconds.setdefault(side, {}).setdefault(stage, []).append(seconds)

    def _timed(self, side: str, stage: str, fn: Callable[[], Any]) -> Any:
        t0 = time.perf_counter()
        out = fn()
        self._note(side, stage, time.perf_counter() - t0)
        return out

    def path(self, side: str) -> None:
        """One version through every stage, the old code (``before``) or the new (``after``)."""
        root = self.work / side
        store = LocalBlobStore(root / "blobs")
        ckpt = self._trainer_side(side, root)
        if side == "after":
            digest = self._timed(side, "publish", lambda: put_weights(store, ckpt, link=True)[0].digest)
        else:
            digest = self._timed(side, "publish", lambda: publish_before(store, ckpt))
        buf = self._timed(side, "fetch", lambda: store.get_buffer(digest))
        self._timed(side, "load", lambda: self._load(state_dict_from_buffer(buf)))
        shutil.rmtree(root)

    def _trainer_side(self, side: str, root: Path) -> Path:
        """The host copy and the committed checkpoint; the host copy is gone when this returns
        (the reader does not need it): at most two copies of the weights are alive."""
        if side == "after":
            staging = HostStaging()
            staging.copy(self.state)      # made and touched once, as the trainer's is (not timed)
            host = self._timed(side, "host", lambda: staging.copy(self.state))
        else:
            host = self._timed(side, "host", lambda: host_before(self.state))

        def write(directory: Path) -> None:
            if side == "after":
                write_weights(host, "{}", directory)
            else:
                write_before(host, directory)

        return self._timed(side, "commit", lambda: commit_checkpoint(root / "ckpt", TrainState(step=1), write, keep=1))

    def _load(self, fetched: dict[str, torch.Tensor]) -> None:
        with torch.no_grad():
            for name, tensor in self.state.items():
                tensor.copy_(fetched[name])

    def references(self) -> None:
        """The same bytes through a plain copy, a write + fsync, a read and one core's sha256."""
        flat = torch.empty(self.nbytes, dtype=torch.uint8)
        flat.fill_(0)                     # a warm destination: the copy's cost, not first-touch page faults
        views = [t.reshape(-1).view(torch.uint8) for t in self.state.values()]

        def memcpy() -> None:
            at = 0
            for v in views:
                flat[at:at + v.numel()].copy_(v)
                at += v.numel()

        self._timed("ref", "memcpy", memcpy)
        target = self.work / "ref.bin"
        data = memoryview(flat.numpy())

        def write_fsync() -> None:
            with open(target, "wb", buffering=0) as fh:
                for i in range(0, len(data), 64 << 20):
                    fh.write(data[i:i + (64 << 20)])
                os.fsync(fh.fileno())

        def read() -> None:
            with open(target, "rb", buffering=0) as fh:
                pos = 0
                while pos < len(data) and (n := fh.readinto(data[pos:pos + (64 << 20)])):
                    pos += n

        def sha256() -> None:
            h = hashlib.sha256()
            for i in range(0, len(data), 64 << 20):
                h.update(data[i:i + (64 << 20)])

        self._timed("ref", "write+fsync", write_fsync)
        self._timed("ref", "read", read)
        self._timed("ref", "sha256", sha256)
        target.unlink()


def summary(values: list[float], nbytes: int) -> dict[str, Any]:
    med = statistics.median(values)
    return {"s": round(med, 3), "min_s": round(min(values), 3), "max_s": round(max(values), 3),
            "gb_per_s": round(nbytes / med / 1e9, 2) if med else None, "passes": [round(v, 3) for v in values]}


def measure(state: dict[str, torch.Tensor], work: Path, n_passes: int, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Interleaved passes: before, after, references; returns the figures."""
    p = Passes(state, work)
    for i in range(n_passes):
        for side in ("before", "after"):
            p.path(side)
        p.references()
        for side in ("before", "after", "ref"):
            log(f"  pass {i + 1} {side}: " + ", ".join(f"{k} {v[-1]:.2f} s" for k, v in p.seconds[side].items()))
    out: dict[str, Any] = {"bytes": p.nbytes, "params": sum(t.numel() for t in state.values()), "passes": n_passes}
    for side in ("before", "after"):
        totals = [sum(p.seconds[side][st][i] for st in STAGES) for i in range(n_passes)]
        out[side] = {st: summary(p.seconds[side][st], p.nbytes) for st in STAGES}
        out[side]["total"] = summary(totals, p.nbytes)
    out["reference"] = {k: summary(v, p.nbytes) for k, v in p.seconds["ref"].items()}
    return out


def table(fig: dict[str, Any]) -> str:
    """The figures as a markdown table: stage, before, after, and the plain copy beside them."""
    mem = fig["reference"]["memcpy"]

    def cell(s: dict[str, Any]) -> str:
        return f"{s['s']:.2f} s ({s['gb_per_s']:.2f} GB/s, {s['min_s']:.2f}-{s['max_s']:.2f})"

    rows = ["| stage | before | after | before/after |", "|---|---|---|---|"]
    for st in (*STAGES, "total"):
        b, a = fig["before"][st], fig["after"][st]
        rows.append(f"| {st} | {cell(b)} | {cell(a)} | {b['s'] / a['s']:.2f} |")
    for name, ref in fig["reference"].items():
        rows.append(f"| reference: {name} | {cell(ref)} | | |")
    rows.append(f"| total / memcpy | {fig['before']['total']['s'] / mem['s']:.1f}x | "
                f"{fig['after']['total']['s'] / mem['s']:.1f}x | |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--params", default="1.0b", choices=sorted(LAYERS))
    ap.add_argument("--passes", type=int, default=5)
    ap.add_argument("--workdir", type=Path, default=None, help="where the files go (default: a temp dir)")
    ap.add_argument("--out", type=Path, default=None, help="write the figures here (JSON)")
    args = ap.parse_args(argv)
    state = qwen_state(LAYERS[args.params], vocab=4096 if args.params == "tiny" else None)
    work = Path(tempfile.mkdtemp(prefix="weight-path-", dir=args.workdir))
    nbytes = sum(t.numel() * t.element_size() for t in state.values())
    print(f"weight path: {sum(t.numel() for t in state.values()) / 1e9:.2f} B bfloat16 parameters, "
          f"{nbytes / 1e9:.2f} GB, {args.passes} interleaved passes, {chunks.threads()} hashing threads", flush=True)
    try:
        fig = measure(state, work, args.passes)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    fig.update(host=platform.node(), cpus=os.cpu_count(), threads=chunks.threads(),
               date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), torch=torch.__version__)
    print(table(fig))
    if args.out is not None:
        args.out.write_text(json.dumps(fig, indent=1) + "\n")
    return fig


if __name__ == "__main__":
    main()
