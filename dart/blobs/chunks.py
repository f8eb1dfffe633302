"""Chunked blobs: a large blob addressed by the sha256 of its chunks' sha256 list, so that it is
written, hashed and verified on every core at once.

A plain blob's address is the sha256 of its bytes: one stream, one core (1.3 GB/s on a core of
an H200 host, 12.7 s for a 7B version on each side, the trainer's and the reader's). A chunked
blob's address is the sha256 of its *chunk list*::

    dart.chunked-sha256.v1 <chunk bytes> <size bytes>
    <sha256 of bytes [0, chunk)>
    <sha256 of bytes [chunk, 2 chunk)>
    ...

Every chunk is hashed on its own, so the hashing spreads over threads (hashlib and pread/pwrite
release the GIL), and the address still binds every byte: a changed byte changes its chunk's
digest, which changes the list, which changes the address. A torn or foreign blob is refused as
surely as a plain one (sha256's collision resistance, one level deeper, as in a Merkle tree).

In the store the list lies beside the bytes (``<digest>.chunks``); see :mod:`dart.blobs`.
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from dart.errors import BlobCorrupted

FORMAT = "dart.chunked-sha256.v1"
CHUNK_BYTES = 16 << 20
"""Bytes per chunk: a 7B version (16.6 GB) is ~1,000 chunks, a list of ~65 KB, and each chunk's
hash (~12 ms at 1.3 GB/s) outweighs handing it to a thread."""
SUFFIX = ".chunks"
"""The file beside a chunked blob (and beside a checkpoint's weights file) that holds its list."""
_IOV = 512
"""Buffers per ``pwritev`` call (under Linux's IOV_MAX of 1024)."""


def threads() -> int:
    """Threads that hash and move chunks: every core, at most 16 (beyond that the memory bus is the limit)."""
    return max(1, min(16, os.cpu_count() or 1))


def chunk_list(digests: list[str], size: int, chunk_bytes: int) -> bytes:
    """The list text of a blob of ``size`` bytes whose chunks hash to ``digests``."""
    return "".join([f"{FORMAT} {chunk_bytes} {size}\n", *(d + "\n" for d in digests)]).encode()


def list_address(listing: bytes) -> str:
    """The blob address a chunk list names."""
    return hashlib.sha256(listing).hexdigest()


def parse_chunk_list(listing: bytes) -> tuple[int, int, list[str]]:
    """(chunk bytes, size bytes, chunk digests) of a list; BlobCorrupted when it is not one."""
    try:
        head, *lines = listing.decode("ascii").splitlines()
        fmt, chunk_s, size_s = head.split(" ")
        chunk, size = int(chunk_s), int(size_s)
    except (UnicodeDecodeError, ValueError) as exc:
        raise BlobCorrupted(f"not a chunk list ({FORMAT}): {exc}") from exc
    if fmt != FORMAT or chunk <= 0 or size < 0 or len(lines) != -(-size // chunk):
        raise BlobCorrupted(f"not a chunk list ({FORMAT}) of {size} bytes in chunks of {chunk}: "
                            f"{head!r} and {len(lines)} digests")
    if any(len(d) != 64 or d.strip("0123456789abcdef") for d in lines):
        raise BlobCorrupted("chunk list: a line is not a sha256 hex digest")
    return chunk, size, lines


def _chunks(pieces: Iterable[memoryview], chunk_bytes: int) -> Iterator[list[memoryview]]:
    """The byte stream of ``pieces`` cut at every ``chunk_bytes``: each chunk as a list of views."""
    out: list[memoryview] = []
    room = chunk_bytes
    for piece in pieces:
        view = memoryview(piece).cast("B")
        while view:
            take = view[:room]
            out.append(take)
            view = view[len(take):]
            room -= len(take)
            if room == 0:
                yield out
                out, room = [], chunk_bytes
    if out:
        yield out


def _pwrite_all(fd: int, views: list[memoryview], offset: int) -> None:
    for i in range(0, len(views), _IOV):
        batch = views[i:i + _IOV]
        while batch:
            n = os.pwritev(fd, batch, offset)
            offset += n
            while batch and n >= len(batch[0]):       # a short write: resume inside the view it stopped in
                n -= len(batch[0])
                batch = batch[1:]
            if batch and n:
                batch[0] = batch[0][n:]


def _write_and_hash(fd: int, views: list[memoryview], offset: int) -> str:
    _pwrite_all(fd, views, offset)
    h = hashlib.sha256()
    for v in views:
        h.update(v)
    return h.hexdigest()


def write_chunked(fd: int, pieces: Iterable[memoryview], *, chunk_bytes: int | None = None) -> bytes:
    """Write the bytes of ``pieces`` to ``fd`` (a file opened for writing, at offset 0), each chunk
    written and hashed by a pool thread, then fsync once; returns the chunk list.

    One pass over the bytes: a chunk is hashed from the memory it is written from. A piece must
    stay unchanged until this returns (views of tensors nobody changes meanwhile)."""
    chunk_bytes = chunk_bytes or CHUNK_BYTES
    digests: list[str] = []
    offset = 0
    with ThreadPoolExecutor(threads(), thread_name_prefix="blob-chunk") as ex:
        running: deque[Future[str]] = deque()
        for views in _chunks(pieces, chunk_bytes):
            if len(running) >= 2 * threads():         # bounded: pieces copied off a GPU are held until written
                digests.append(running.popleft().result())
            running.append(ex.submit(_write_and_hash, fd, views, offset))
            offset += sum(len(v) for v in views)
        digests.extend(f.result() for f in running)
    os.ftruncate(fd, offset)
    os.fsync(fd)
    return chunk_list(digests, offset, chunk_bytes)


def _read_into(fd: int, view: memoryview, offset: int) -> bool:
    """Fill ``view`` from ``offset``; False when the file ends first."""
    got = 0
    while got < len(view):
        n = os.preadv(fd, [view[got:]], offset + got)
        if n == 0:
            return False
        got += n
    return True


def hash_file(path: Path, *, chunk_bytes: int | None = None) -> bytes:
    """The chunk list of a file, its chunks read and hashed on every core."""
    chunk_bytes = chunk_bytes or CHUNK_BYTES
    with open(path, "rb", buffering=0) as fh:
        size = os.fstat(fh.fileno()).st_size
        count = -(-size // chunk_bytes)
        local = threading.local()

        def one(k: int) -> str:
            buf = getattr(local, "buf", None) or bytearray(chunk_bytes)
            local.buf = buf
            view = memoryview(buf)[:min(chunk_bytes, size - k * chunk_bytes)]
            if not _read_into(fh.fileno(), view, k * chunk_bytes):
                raise BlobCorrupted(f"{path} shrank while it was hashed")
            return hashlib.sha256(view).hexdigest()

        with ThreadPoolExecutor(threads(), thread_name_prefix="blob-chunk") as ex:
            digests = list(ex.map(one, range(count)))
    return chunk_list(digests, size, chunk_bytes)


def read_chunked(path: Path, listing: bytes, alloc: Callable[[int], Any] | None = None) -> Any:
    """Read a chunked blob once, every chunk verified against ``listing`` as it lands (each on a
    pool thread); returns the buffer ``alloc(size)`` made (a bytearray, or pinned host memory),
    or None when ``alloc`` is None (verify only, through one scratch chunk per thread).

    BlobCorrupted when the file's size or any chunk differs from the list: a torn blob."""
    chunk, size, digests = parse_chunk_list(listing)
    with open(path, "rb", buffering=0) as fh:
        fd = fh.fileno()
        if os.fstat(fd).st_size != size:
            raise BlobCorrupted(f"blob {path.name} is torn: {os.fstat(fd).st_size} bytes, its list says {size}")
        buf = alloc(size) if alloc is not None else None
        whole = memoryview(buf).cast("B") if buf is not None else None
        local = threading.local()

        def one(k: int) -> bool:
            n = min(chunk, size - k * chunk)
            if whole is not None:
                view = whole[k * chunk:k * chunk + n]
            else:
                local.buf = getattr(local, "buf", None) or bytearray(chunk)
                view = memoryview(local.buf)[:n]
            return _read_into(fd, view, k * chunk) and hashlib.sha256(view).hexdigest() == digests[k]

        with ThreadPoolExecutor(threads(), thread_name_prefix="blob-chunk") as ex:
            ok = list(ex.map(one, range(len(digests))))
    if not all(ok):
        raise BlobCorrupted(f"blob {path.name} is corrupted: chunk {ok.index(False)} of {len(ok)} hashes differently")
    return buf
