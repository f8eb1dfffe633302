"""Chunked blobs: addressed by the sha256 of their chunk list, hashed and verified on every core,
and refused when torn or foreign exactly as a plain blob is."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from dart.blobs import LocalBlobStore, chunks
from dart.errors import BlobCorrupted, BlobNotFound

CHUNK = 4096


@pytest.fixture(autouse=True)
def small_chunks(monkeypatch):
    monkeypatch.setattr(chunks, "CHUNK_BYTES", CHUNK)


def written(path: Path, pieces: list[bytes]) -> bytes:
    """``pieces`` written as a checkpoint writer does: the file, and its list beside it."""
    with open(path, "wb", buffering=0) as fh:
        listing = chunks.write_chunked(fh.fileno(), [memoryview(p) for p in pieces])
    path.with_name(path.name + chunks.SUFFIX).write_bytes(listing)
    return listing


def test_the_address_binds_every_chunk_and_the_parallel_digests_are_each_chunks_sha256(tmp_path):
    pieces = [os.urandom(n) for n in (10, 5000, 3, 7000, 1, 4096, 123)]  # pieces across chunk borders
    data = b"".join(pieces)
    listing = written(tmp_path / "w", pieces)
    assert (tmp_path / "w").read_bytes() == data
    head, *lines = listing.decode().splitlines()
    assert head == f"{chunks.FORMAT} {CHUNK} {len(data)}"
    assert lines == [hashlib.sha256(data[i:i + CHUNK]).hexdigest() for i in range(0, len(data), CHUNK)]
    assert chunks.hash_file(tmp_path / "w") == listing                 # the reader's hashing agrees
    assert chunks.list_address(listing) == hashlib.sha256(listing).hexdigest()


def test_a_chunked_blob_is_linked_unread_and_read_back_verified(tmp_path, monkeypatch):
    store = LocalBlobStore(tmp_path / "blobs")
    data = os.urandom(3 * CHUNK + 17)
    ckpt = tmp_path / "model.safetensors"
    address = chunks.list_address(written(ckpt, [data]))

    def no_read(*_a, **_kw):
        raise AssertionError("hashed the file although its writer's list hashes to the digest")
    with monkeypatch.context() as m:
        m.setattr(chunks, "hash_file", no_read)
        assert store.put_file(ckpt, link=True, digest=address, chunked=True) == address
    assert store.local_path(address).stat().st_ino == ckpt.stat().st_ino
    assert bytes(store.get_buffer(address)) == data and store.get(address) == data and store.exists(address)
    copy = LocalBlobStore(tmp_path / "copy")                            # not linked: the copy is hashed here
    assert copy.put_file(ckpt, chunked=True) == address
    assert copy.local_path(address).stat().st_ino != ckpt.stat().st_ino and copy.get(address) == data
    assert not list((tmp_path / "copy").rglob(".tmp-*"))


def test_a_torn_chunked_blob_is_refused_by_every_read(tmp_path):
    store = LocalBlobStore(tmp_path / "blobs")
    data = os.urandom(5 * CHUNK)
    (tmp_path / "f").write_bytes(data)
    address = store.put_file(tmp_path / "f", chunked=True)
    path = store.local_path(address, verify=False)
    with open(path, "r+b") as fh:                                      # one byte of chunk 3 flipped
        fh.seek(3 * CHUNK + 5)
        fh.write(bytes([data[3 * CHUNK + 5] ^ 1]))
    for read in (store.get, store.get_buffer, store.local_path):
        with pytest.raises(BlobCorrupted, match="chunk 3 of 5"):
            read(address)
    os.truncate(path, 4 * CHUNK)                                       # cut short: its size says so
    for read in (store.get, store.get_buffer, store.local_path):
        with pytest.raises(BlobCorrupted, match="torn"):
            read(address)


def test_a_foreign_blob_at_the_address_is_refused_even_with_a_list_of_its_own(tmp_path):
    store = LocalBlobStore(tmp_path / "blobs")
    (tmp_path / "f").write_bytes(os.urandom(2 * CHUNK))
    address = store.put_file(tmp_path / "f", chunked=True)
    path = store.local_path(address, verify=False)
    foreign = os.urandom(2 * CHUNK)
    path.write_bytes(foreign)                                          # other bytes under the address ...
    with pytest.raises(BlobCorrupted, match="chunk 0 of 2"):
        store.get_buffer(address)
    (tmp_path / "g").write_bytes(foreign)                              # ... and a list that fits them
    path.with_name(path.name + chunks.SUFFIX).write_bytes(chunks.hash_file(tmp_path / "g"))
    for read in (store.get, store.get_buffer, store.local_path):
        with pytest.raises(BlobCorrupted, match="chunk list hashes differently"):
            read(address)


def test_a_writer_whose_list_does_not_fit_its_bytes_makes_a_blob_no_read_serves(tmp_path):
    store = LocalBlobStore(tmp_path / "blobs")
    ckpt = tmp_path / "model.safetensors"
    listing = written(ckpt, [os.urandom(2 * CHUNK)])
    ckpt.write_bytes(os.urandom(2 * CHUNK))                            # changed after its list was written
    address = store.put_file(ckpt, link=True, digest=chunks.list_address(listing), chunked=True)
    for read in (store.get, store.get_buffer, store.local_path):
        with pytest.raises(BlobCorrupted):
            read(address)
    with pytest.raises(BlobNotFound):
        store.get_buffer(chunks.list_address(b"no such list"))


@pytest.mark.parametrize("listing", [b"", b"plain text\n", f"{chunks.FORMAT} 4096 5000\n{'a' * 64}\n".encode(),
                                     f"{chunks.FORMAT} 4096 10\nnot-a-digest\n".encode()])
def test_a_malformed_chunk_list_is_a_clear_error(listing: bytes):
    with pytest.raises(BlobCorrupted, match="chunk list"):
        chunks.parse_chunk_list(listing)


def test_reads_land_in_the_buffer_the_caller_allocates(tmp_path):
    store = LocalBlobStore(tmp_path / "blobs")
    data = os.urandom(2 * CHUNK + 1)
    (tmp_path / "f").write_bytes(data)
    made: list[int] = []

    def alloc(size: int) -> bytearray:
        made.append(size)
        return bytearray(size)
    assert bytes(store.get_buffer(store.put_file(tmp_path / "f", chunked=True), alloc)) == data
    assert bytes(store.get_buffer(store.put(b"plain"), alloc)) == b"plain"   # a plain blob takes it too
    assert made == [len(data), 5]
