"""Content-addressed blob store: screenshots, weights and batch manifests live here, events
carry their sha256 (claim-check pattern). Identical bytes are stored once.

The local store keeps ``ROOT/ab/cd/<digest>``; writes go to a temporary file in the same
directory and are renamed into place, so a reader never sees half a blob; every read checks
the digest, so a corrupted blob is an error, never silently returned.

A large blob (a version's weights) may be *chunked* (:mod:`dart.blobs.chunks`): its address is
the sha256 of its chunk list, kept beside it as ``<digest>.chunks`` and placed before the bytes
(a reader that finds the bytes finds their list). Every read checks a chunked blob too, on every
core: the list against the address, each chunk against the list.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import tempfile
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, BinaryIO, Protocol

from dart.blobs import chunks
from dart.errors import BlobCorrupted, BlobError, BlobNotFound

log = logging.getLogger(__name__)

_CHUNK = 8 << 20
"""Large enough that a chunk's hash and write outweigh handing it to the hashing thread."""


def _read_chunks(fh: BinaryIO) -> Iterator[memoryview]:
    """A file's bytes in ``_CHUNK``s, read into two buffers in turn: a chunk stays valid until
    the one after next is read (``put_chunks`` is done with it by then), and nothing is allocated
    per chunk."""
    buffers = (bytearray(_CHUNK), bytearray(_CHUNK))
    i = 0
    while True:
        buf = buffers[i]
        n = fh.readinto(buf)
        if not n:
            return
        yield memoryview(buf)[:n]
        i ^= 1


def _hash_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb", buffering=0) as fh:
        for chunk in _read_chunks(fh):
            h.update(chunk)
    return h.hexdigest()


def write_hashed(fh: BinaryIO, chunks: Iterable[bytes | memoryview]) -> str:
    """Write ``chunks`` to ``fh`` (opened unbuffered) while a second thread hashes them, fsync it
    once; returns the sha256 hex digest of what was written.

    hashlib and write both release the GIL, so on two cores hashing costs no wall time. A chunk
    must stay unchanged until the chunk after the next one is asked for (a generator filling two
    buffers in turn is fine, and so are views of tensors nobody changes meanwhile).
    """
    h = hashlib.sha256()
    with ThreadPoolExecutor(1, thread_name_prefix="blob-hash") as ex:
        hashing: Future[None] | None = None
        for chunk in chunks:
            view = memoryview(chunk).cast("B")
            if hashing is not None:
                hashing.result()
            hashing = ex.submit(h.update, view)
            while view:
                view = view[fh.write(view):]
        if hashing is not None:
            hashing.result()
    os.fsync(fh.fileno())
    return h.hexdigest()


def _read_verified(path: Path, digest: str, root: Path, alloc: Callable[[int], Any]) -> Any:
    """The whole file in one buffer, each chunk hashed on a second thread while the next is read;
    BlobCorrupted unless the bytes hash to ``digest``."""
    h = hashlib.sha256()
    with open(path, "rb", buffering=0) as fh, ThreadPoolExecutor(1, thread_name_prefix="blob-hash") as ex:
        size = os.fstat(fh.fileno()).st_size
        buf = alloc(size)
        view = memoryview(buf).cast("B")
        hashing: Future[None] | None = None
        pos = 0
        while pos < size and (n := fh.readinto(view[pos:pos + _CHUNK])):
            if hashing is not None:
                hashing.result()
            hashing = ex.submit(h.update, view[pos:pos + n])
            pos += n
        if hashing is not None:
            hashing.result()
        whole = pos == size and not fh.read(1)  # a file that shrank or grew meanwhile is no blob
    if not whole or h.hexdigest() != digest:
        raise BlobCorrupted(f"blob {digest} under {root} is corrupted: its bytes hash differently")
    return buf


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _check_digest(digest: str) -> str:
    if len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
        raise BlobError(f"not a sha256 hex digest: {digest!r}")
    return digest



def fsync_dir(directory: Path) -> None:
    """Make a rename or a new file in ``directory`` durable (the directory entry itself is fsynced)."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)

Alloc = Callable[[int], Any]
"""Makes the writable buffer (bytearray-like) a blob of that many bytes is read into."""


class BlobStore(Protocol):
    def put(self, data: bytes) -> str: ...
    def put_file(self, path: Path, *, link: bool = False, digest: str | None = None,
                 chunked: bool = False) -> str: ...
    def get(self, digest: str) -> bytes: ...
    def get_buffer(self, digest: str, alloc: Alloc | None = None) -> Any: ...
    def exists(self, digest: str) -> bool: ...
    def local_path(self, digest: str, *, verify: bool = True) -> Path: ...


class LocalBlobStore:
    """Blobs in a local (or shared-filesystem) directory."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)

    def _path(self, digest: str) -> Path:
        _check_digest(digest)
        return self.root / digest[:2] / digest[2:4] / digest

    def put(self, data: bytes) -> str:
        """Store bytes; returns their sha256 hex digest. Idempotent."""
        digest = sha256_hex(data)
        path = self._path(digest)
        if not path.exists():
            self._write_atomic(path, [data])
        return digest

    def put_file(self, path: Path, *, link: bool = False, digest: str | None = None, chunked: bool = False) -> str:
        """Store a file's bytes (streamed, for large weights); returns the digest.

        One pass: each chunk is hashed and written at once, the file fsynced once and renamed to
        its digest when the last chunk is in (a second pass to hash first read the file twice).

        ``link``: the caller promises the file is durable (fsynced) and is never written again
        (a trainer's checkpoint: written under a temporary name, renamed, then only removed).
        Then the blob is a hard link to it when both are on one filesystem: no copy at all, the
        file is only read to hash it. A user's file must not be linked: a later edit of it would
        change the blob (reads would then fail their digest check).

        ``digest`` (with ``link``): the file's sha256 as its writer hashed the bytes it wrote
        (:func:`write_hashed`, e.g. ``dart.agent.weight_format.write_weights``); the file is then linked
        without being read at all. The writer's word is checked where it matters: every read
        verifies the bytes (:meth:`get`, :meth:`get_buffer`, :meth:`local_path`), so a wrong
        digest makes a blob that is refused as corrupted, never wrong bytes served; and where the
        file must be copied instead, a copy that hashes differently is refused here.

        ``chunked``: store it as a chunked blob (:meth:`put_chunked_file`).
        """
        if digest is not None and not link:
            raise BlobError("put_file: a digest is trusted only for a linked, committed file (link=True)")
        if chunked:
            return self.put_chunked_file(path, link=link, digest=digest)
        if link:
            digest = _check_digest(digest) if digest is not None else _hash_file(path)
            target = self._path(digest)
            if target.exists():
                return digest
            target.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.link(path, target)
            except FileExistsError:          # stored meanwhile: the same bytes
                return digest
            except OSError:                  # another filesystem, or links not allowed: copy
                log.debug("cannot link %s into %s: copying", path, self.root, exc_info=True)
            else:
                fsync_dir(target.parent)
                return digest
        with open(path, "rb", buffering=0) as fh:
            stored = self.put_chunks(_read_chunks(fh))
        if digest is not None and stored != digest:
            raise BlobCorrupted(f"{path} hashes to {stored}, not to {digest} as its writer said: changed since written")
        return stored

    def put_chunked_file(self, path: Path, *, link: bool = False, digest: str | None = None) -> str:
        """Store a file as a chunked blob (:mod:`dart.blobs.chunks`); returns its address.

        ``link`` and ``digest`` as in :meth:`put_file`; the writer's list is the file beside it
        (``<file>.chunks``, written by :func:`dart.blobs.chunks.write_chunked`'s caller) and is
        used when it hashes to ``digest``; otherwise the file (or its copy) is hashed here, on
        every core. The list is placed before the bytes."""
        side = path.with_name(path.name + chunks.SUFFIX)
        listing = None
        if link and digest is not None and side.is_file():
            text = side.read_bytes()
            listing = text if chunks.list_address(text) == _check_digest(digest) else None
        tmp: Path | None = None
        if not link:                          # a file someone may still write: hash the copy, not it
            fd, name = tempfile.mkstemp(dir=self.root, prefix=".tmp-")
            os.close(fd)
            tmp = Path(name)
            shutil.copyfile(path, tmp)
        try:
            if listing is None:
                listing = chunks.hash_file(tmp or path)
            address = chunks.list_address(listing)
            target = self._path(address)
            if target.exists():
                return address
            self._write_atomic(target.with_name(target.name + chunks.SUFFIX), [listing])
            if tmp is not None:
                with open(tmp, "rb") as fh:
                    os.fsync(fh.fileno())
                os.replace(tmp, target)
            else:
                try:
                    os.link(path, target)
                except FileExistsError:
                    return address
                except OSError:               # another filesystem: a copy, checked against the list
                    log.debug("cannot link %s into %s: copying", path, self.root, exc_info=True)
                    shutil.copyfile(path, target.with_name(target.name + ".tmp"))
                    chunks.read_chunked(target.with_name(target.name + ".tmp"), listing)
                    os.replace(target.with_name(target.name + ".tmp"), target)
            fsync_dir(target.parent)
            return address
        finally:
            if tmp is not None:
                tmp.unlink(missing_ok=True)

    def _listing(self, path: Path, digest: str) -> bytes | None:
        """A chunked blob's list (checked against its address), or None for a plain blob."""
        try:
            listing = path.with_name(path.name + chunks.SUFFIX).read_bytes()
        except FileNotFoundError:
            return None
        if chunks.list_address(listing) != digest:
            raise BlobCorrupted(f"blob {digest} under {self.root} is corrupted: its chunk list hashes differently")
        return listing

    def put_chunks(self, chunks: Iterable[bytes | memoryview]) -> str:
        """Store the bytes of ``chunks``; returns the digest. A chunk must stay unchanged until the
        chunk after the next one is asked for (a generator filling two buffers in turn is fine).

        The chunks go to a temporary file in the store's root, hashed as they are written
        (:func:`write_hashed`: one fsync), then the file is renamed to its digest (dropped if
        that blob is already there).
        """
        fd, tmp = tempfile.mkstemp(dir=self.root, prefix=".tmp-")
        try:
            with os.fdopen(fd, "wb", buffering=0) as fh:
                digest = write_hashed(fh, chunks)
            target = self._path(digest)
            if target.exists():
                Path(tmp).unlink()
                return digest
            target.parent.mkdir(parents=True, exist_ok=True)
            os.replace(tmp, target)
            fsync_dir(target.parent)
            return digest
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    def get(self, digest: str) -> bytes:
        """The bytes stored under digest, verified; raises BlobNotFound / BlobCorrupted."""
        path = self._path(digest)
        if self._listing(path, digest) is not None:
            return bytes(self.get_buffer(digest))
        try:
            data = path.read_bytes()
        except FileNotFoundError as exc:
            raise BlobNotFound(f"no blob {digest} under {self.root}") from exc
        except OSError as exc:
            raise BlobError(f"cannot read blob {digest}: {exc}") from exc
        if sha256_hex(data) != digest:
            raise BlobCorrupted(f"blob {digest} under {self.root} is corrupted: its bytes hash differently")
        return data

    def get_buffer(self, digest: str, alloc: Alloc | None = None) -> Any:
        """The blob's bytes, verified, in one writable buffer (``alloc(size)``, default a bytearray;
        pinned host memory for a GPU's load): read once, no second copy (tensors can be views of
        it). A plain blob is hashed on a second thread while the next chunk is read; a chunked one
        is read and verified chunk by chunk on every core. Raises like :meth:`get`."""
        path = self._path(digest)
        try:
            listing = self._listing(path, digest)
            if listing is not None:
                return chunks.read_chunked(path, listing, alloc or bytearray)
            return _read_verified(path, digest, self.root, alloc or bytearray)
        except BlobError:
            raise
        except FileNotFoundError as exc:
            raise BlobNotFound(f"no blob {digest} under {self.root}") from exc
        except OSError as exc:
            raise BlobError(f"cannot read blob {digest}: {exc}") from exc

    def exists(self, digest: str) -> bool:
        return self._path(digest).exists()

    def local_path(self, digest: str, *, verify: bool = True) -> Path:
        """A path to read the blob from (verified first unless verify=False)."""
        path = self._path(digest)
        if not path.exists():
            raise BlobNotFound(f"no blob {digest} under {self.root}")
        if verify and (listing := self._listing(path, digest)) is not None:
            chunks.read_chunked(path, listing)
        elif verify and _hash_file(path) != digest:
            raise BlobCorrupted(f"blob {digest} under {self.root} is corrupted: its bytes hash differently")
        return path

    def _write_atomic(self, path: Path, chunks) -> None:  # type: ignore[no-untyped-def]
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
        try:
            with os.fdopen(fd, "wb") as fh:
                for chunk in chunks:
                    fh.write(chunk)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise


def open_store(url: str | Path) -> LocalBlobStore:
    """A blob store from a URL: a directory path or ``file://`` URL. (S3 is not built yet.)"""
    text = str(url)
    if text.startswith("file://"):
        text = text[len("file://") :]
    elif "://" in text:
        raise BlobError(f"blob store URL {text!r}: only local directories (or file://) are supported")
    return LocalBlobStore(text)


def blob_set_digest(refs: Iterable[tuple[str, str]]) -> str:
    """One sha256 naming a set of named blobs (``WeightsPublished.sha256``): over the sorted
    ``"name digest"`` lines joined by newlines, so the order of publication does not matter."""
    lines = sorted(f"{name} {digest}" for name, digest in refs)
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()
