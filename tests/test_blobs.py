"""The content-addressed blob store."""

from __future__ import annotations

import hashlib
import os

import pytest

from dart.blobs import LocalBlobStore, open_store
from dart.errors import BlobCorrupted, BlobError, BlobNotFound


def test_put_returns_the_sha256_and_get_returns_the_bytes(blobs: LocalBlobStore):
    data = b"screenshot bytes"
    digest = blobs.put(data)
    assert digest == hashlib.sha256(data).hexdigest()
    assert blobs.exists(digest) and blobs.get(digest) == data


def test_identical_bytes_are_stored_once(blobs: LocalBlobStore):
    a = blobs.put(b"same")
    b = blobs.put(b"same")
    assert a == b
    assert sum(1 for p in blobs.root.rglob("*") if p.is_file()) == 1


def test_a_corrupted_blob_is_an_error_never_returned(blobs: LocalBlobStore):
    digest = blobs.put(b"weights v1")
    path = blobs.root / digest[:2] / digest[2:4] / digest
    path.write_bytes(b"weights v2")
    with pytest.raises(BlobCorrupted, match=digest):
        blobs.get(digest)
    with pytest.raises(BlobCorrupted):
        blobs.local_path(digest)


def test_missing_blob_and_bad_digest_are_clear_errors(blobs: LocalBlobStore):
    with pytest.raises(BlobNotFound):
        blobs.get("0" * 64)
    with pytest.raises(BlobError, match="not a sha256"):
        blobs.get("../../etc/passwd")


def test_put_file_streams_large_files(blobs: LocalBlobStore, tmp_path):
    big = tmp_path / "model.safetensors"
    data = os.urandom(3 * 1024 * 1024 + 17)
    big.write_bytes(data)
    digest = blobs.put_file(big)
    assert digest == hashlib.sha256(data).hexdigest()
    assert blobs.local_path(digest).read_bytes() == data


def test_writes_leave_no_temporary_files(blobs: LocalBlobStore):
    for i in range(5):
        blobs.put(f"blob {i}".encode())
    assert not [p for p in blobs.root.rglob(".tmp-*")]


def test_open_store_accepts_paths_and_file_urls_and_refuses_others(tmp_path):
    assert open_store(tmp_path / "a").root == tmp_path / "a"
    assert open_store(f"file://{tmp_path}/b").root == tmp_path / "b"
    with pytest.raises(BlobError, match="only local"):
        open_store("s3://bucket/x")


def test_put_file_of_many_chunks_is_stored_once_under_its_digest(blobs: LocalBlobStore, tmp_path):
    # Chunks come from two buffers filled in turn while the previous one is hashed: a buffer
    # overwritten too early would give another digest or other bytes.
    from dart.blobs import _CHUNK

    big = tmp_path / "weights.bin"
    data = os.urandom(2 * _CHUNK) + bytes(range(256)) * (_CHUNK // 256) + b"tail"
    big.write_bytes(data)
    digest = blobs.put_file(big)
    assert digest == hashlib.sha256(data).hexdigest()
    assert blobs.local_path(digest).read_bytes() == data
    assert blobs.put_file(big) == digest                     # again: the copy is dropped, nothing left over
    assert [p.name for p in blobs.root.rglob("*") if p.is_file()] == [digest]
    assert blobs.put_chunks([]) == hashlib.sha256(b"").hexdigest()
