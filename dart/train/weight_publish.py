"""Publishing a policy version: its files into the blob store, and the ``WeightsPublished`` event.

The format of a version (files, blob names, the version digest) is :mod:`dart.agent.weight_format`,
shared with the rollout workers that load it.
"""

from __future__ import annotations

from pathlib import Path

from dart.agent.weight_format import PUBLISHED_FILES, WEIGHTS_FILE, weights_sha256, written_digests
from dart.blobs import BlobStore
from dart.events import BlobRef, WeightsPublished


def put_weights(store: BlobStore, directory: Path, *, link: bool = False) -> list[BlobRef]:
    """Store a version's files (streamed, content-addressed: an unchanged file is stored once).

    ``link`` when ``directory`` is a committed checkpoint (``dart.train.checkpoint``: fsynced,
    renamed into place, never written again): the store then links its files where it can
    instead of copying them (``LocalBlobStore.put_file``), and a file whose digest its writer
    recorded (``SHA256SUMS`` and the weights' chunk list, :func:`dart.agent.weight_format.write_weights`)
    is not even read: the version is published in the time of a link. Not for a directory someone may write again
    (``dart sft --out``): there each file is hashed and copied.
    """
    known = written_digests(directory) if link else {}
    refs = []
    for name in PUBLISHED_FILES:
        path = directory / name
        # the weights are a chunked blob: hashed, written and verified on every core (dart.blobs.chunks)
        digest = store.put_file(path, link=link, digest=known.get(name), chunked=name == WEIGHTS_FILE)
        refs.append(BlobRef(name=name, digest=digest, size_bytes=path.stat().st_size))
    return refs


def weights_published(*, run_id: str, producer: str, version: int, blobs: list[BlobRef], train_step: int,
                      batch_id: str | None) -> WeightsPublished:
    """The announcement of policy ``version`` (its parent is version - 1; -1 for the initial weights)."""
    return WeightsPublished.new(
        run_id=run_id, producer=producer, version=version, parent_version=version - 1, blobs=blobs,
        sha256=weights_sha256(blobs), format="safetensors", train_step=train_step, batch_id=batch_id,
    )
