"""Publishing a weight version into the blob store, against the disk's own write speed.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/blob_publish.py [--sizes 160m,1.0b] [--passes 5]

Per size, a version directory as the trainer's checkpoint holds it (``write_weights``: a
bfloat16 state dict of that many parameters, random values, and its config) is written once;
then, pass by pass and interleaved (``benchmarks/passes.py``), four sides store its bytes:

- ``publish``: the trainer's publication step (``BlobTransfer.publish``: ``put_weights`` of a
  committed checkpoint, linked into the store when on its filesystem, under the digests
  ``write_weights`` recorded as it wrote the files: nothing is read) into an empty blob store,
  as ``weight_sync.py``'s publish column times it;
- ``copy``: ``put_file`` without linking (a store on another filesystem): one pass, hashed on a
  second thread while written, one fsync;
- ``two-pass``: the blob store's copy as it was before (hash the file, then copy it, fsync);
- ``disk``: the same number of bytes written from memory and fsynced once, no hashing: what the
  disk allows;
- ``state``: the whole way from the state dict to a stored version as the trainer goes it: the
  checkpoint's files written (``write_weights``: tensor by tensor, hashed as written, one fsync)
  and published (linked under the recorded digests);
- ``state-before``: the same way as it was before: ``safetensors.torch.save_file``, fsync, then
  the publication hashing the file to link it.

``--sides`` picks some of them (``state,state-before,disk`` is the state-dict comparison).

MB/s is the version's ``model.safetensors`` size over the wall time. Each pass ends with the
store removed; the checkpoint stays in the page cache, as it does after the trainer writes it.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import passes
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from safetensors.torch import load_file  # noqa: E402

from dart.agent.weight_format import CONFIG_FILE, WEIGHTS_FILE, write_weights  # noqa: E402
from dart.blobs import LocalBlobStore  # noqa: E402
from dart.train.weight_publish import put_weights  # noqa: E402
from dart.train.weight_send import BlobTransfer  # noqa: E402

PARAMS = {"26m": 27_400_000, "160m": 162_300_000, "1.0b": 1_000_800_000}
"""Parameters of ``weight_sync.py``'s sizes of the same names."""
_CHUNK = 1 << 20


def version_dir(root: Path, params: int) -> Path:
    """A checkpoint's version files: ``params`` bfloat16 values in 64 tensors, and a config."""
    out = root / f"v{params}"
    per = params // 64
    gen = torch.Generator().manual_seed(0)
    state = {f"model.layers.{i}.weight": torch.randn(per, generator=gen).to(torch.bfloat16) for i in range(64)}
    write_weights(state, '{"model_type": "bench"}', out)
    return out


def write_state(state: dict[str, torch.Tensor], out: Path) -> Path:
    write_weights(state, "{}", out)
    return out


def two_pass(store_root: Path, path: Path) -> None:
    """The copy as the blob store made it before: hash the file, then copy it and fsync."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(_CHUNK):
            h.update(chunk)
    digest = h.hexdigest()
    target = store_root / digest[:2] / digest[2:4] / digest
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".tmp-")
    with os.fdopen(fd, "wb") as out, open(path, "rb") as fh:
        while chunk := fh.read(_CHUNK):
            out.write(chunk)
        out.flush()
        os.fsync(out.fileno())
    os.replace(tmp, target)


def state_before(state: dict[str, torch.Tensor], out: Path, store: LocalBlobStore) -> None:
    """State dict to stored version as before: safetensors writes the file, fsync, then the
    publication reads it again to hash it and links it."""
    from safetensors.torch import save_file

    out.mkdir()
    save_file(state, str(out / WEIGHTS_FILE))
    (out / CONFIG_FILE).write_text("{}")
    for name in (WEIGHTS_FILE, CONFIG_FILE):
        with open(out / name, "rb") as fh:
            os.fsync(fh.fileno())
    put_weights(store, out, link=True)


def disk(root: Path, size: int) -> None:
    block = os.urandom(8 << 20)
    with open(root / "disk.bin", "wb", buffering=0) as fh:
        left = size
        while left > 0:
            left -= fh.write(memoryview(block)[:min(left, len(block))])
        os.fsync(fh.fileno())
    (root / "disk.bin").unlink()


def measure(work: Path, name: str, n_passes: int, only: list[str]) -> None:
    """One size: its version written once, then the sides pass by pass."""
    vdir = version_dir(work, PARAMS[name])
    state = load_file(vdir / WEIGHTS_FILE)
    size = (vdir / WEIGHTS_FILE).stat().st_size
    mb = size / 1e6
    print(f"{name}: {PARAMS[name] / 1e6:.1f} M bfloat16 parameters, {mb:.1f} MB, {n_passes} passes per side, "
          f"interleaved", flush=True)

    def timed(fn) -> float:  # type: ignore[no-untyped-def]
        store = work / "store"
        store.mkdir()
        t0 = time.perf_counter()
        fn(store)
        rate = mb / (time.perf_counter() - t0)
        shutil.rmtree(store)
        return rate

    sides = {
        "publish": lambda _i: timed(lambda s: BlobTransfer().publish(1, vdir, LocalBlobStore(s))),
        "copy": lambda _i: timed(lambda s: LocalBlobStore(s).put_file(vdir / WEIGHTS_FILE)),
        "two-pass": lambda _i: timed(lambda s: two_pass(s, vdir / WEIGHTS_FILE)),
        "disk": lambda _i: timed(lambda s: disk(s, size)),
        "state": lambda _i: timed(lambda s: BlobTransfer().publish(1, write_state(state, s / "ckpt"),
                                                                   LocalBlobStore(s / "blobs"))),
        "state-before": lambda _i: timed(lambda s: state_before(state, s / "ckpt", LocalBlobStore(s / "blobs"))),
    }
    rates = passes.interleave({k: v for k, v in sides.items() if k in only}, n_passes,
                              on_pass=passes.pass_line("MB/s"))
    print(passes.report(rates, "MB/s"))
    for num, den in (("publish", "disk"), ("copy", "disk"), ("publish", "two-pass"), ("copy", "two-pass"),
                     ("state", "disk"), ("state-before", "disk"), ("state", "state-before")):
        if num in rates and den in rates:
            print(passes.ratio_line(rates, num, den))
    sys.stdout.flush()
    shutil.rmtree(vdir)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="160m,1.0b", help=f"comma-separated, of {', '.join(PARAMS)}")
    ap.add_argument("--passes", type=int, default=passes.MIN_PASSES)
    ap.add_argument("--workdir", type=Path, default=None, help="where the files go (default: a temp dir)")
    ap.add_argument("--sides", default="publish,copy,two-pass,disk,state,state-before")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="blob-publish-", dir=args.workdir))
    try:
        for name in args.sizes.split(","):
            measure(work, name, args.passes, args.sides.split(","))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
