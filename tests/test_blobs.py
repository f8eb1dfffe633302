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


def test_put_file_with_link_stores_a_committed_file_without_copying_it(blobs: LocalBlobStore, tmp_path,
                                                                       monkeypatch):
    ckpt = tmp_path / "step-1" / "model.safetensors"
    ckpt.parent.mkdir()
    ckpt.write_bytes(os.urandom(100_000))
    digest = blobs.put_file(ckpt, link=True)
    assert digest == hashlib.sha256(ckpt.read_bytes()).hexdigest()
    assert blobs.local_path(digest).stat().st_ino == ckpt.stat().st_ino       # the same file, no copy
    data = ckpt.read_bytes()
    ckpt.unlink()                                                             # a checkpoint pruned later
    assert blobs.get(digest) == data
    # where links are refused (another filesystem), the bytes are copied
    other = tmp_path / "other.bin"
    other.write_bytes(b"x" * 5000)

    def refuse(*_a, **_kw):
        raise OSError(18, "Invalid cross-device link")
    monkeypatch.setattr(os, "link", refuse)
    d2 = blobs.put_file(other, link=True)
    assert blobs.local_path(d2).stat().st_ino != other.stat().st_ino and blobs.get(d2) == b"x" * 5000
    assert not [p for p in blobs.root.rglob(".tmp-*")]


def test_the_trainer_publishes_a_checkpoint_by_linking_and_sft_output_by_copying(blobs: LocalBlobStore, tmp_path):
    from dart.agent.weight_format import CONFIG_FILE, WEIGHTS_FILE
    from dart.train.weight_publish import put_weights
    from dart.train.weight_send import BlobTransfer

    version = tmp_path / "ckpt"
    version.mkdir()
    (version / WEIGHTS_FILE).write_bytes(os.urandom(4096))
    (version / CONFIG_FILE).write_text("{}")
    refs = BlobTransfer().publish(1, version, blobs)
    assert [r.name for r in refs] == [WEIGHTS_FILE, CONFIG_FILE]
    assert all(blobs.local_path(r.digest).stat().st_ino == (version / r.name).stat().st_ino for r in refs)
    sft = tmp_path / "sft"
    sft.mkdir()
    (sft / WEIGHTS_FILE).write_bytes(os.urandom(4096))
    (sft / CONFIG_FILE).write_text('{"a": 1}')
    for r in put_weights(blobs, sft):
        assert blobs.local_path(r.digest).stat().st_ino != (sft / r.name).stat().st_ino


def test_get_buffer_returns_the_verified_bytes_and_refuses_a_corrupted_or_missing_blob(blobs: LocalBlobStore):
    from dart.blobs import _CHUNK

    data = os.urandom(2 * _CHUNK + 5)                    # several chunks, each hashed while the next is read
    digest = blobs.put(data)
    buf = blobs.get_buffer(digest)
    assert isinstance(buf, bytearray) and buf == data
    path = blobs.local_path(digest, verify=False)
    path.chmod(0o644)
    path.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))  # the last byte flipped
    with pytest.raises(BlobCorrupted, match=digest):
        blobs.get_buffer(digest)
    path.write_bytes(data + b"!")                         # a longer file is no more that blob
    with pytest.raises(BlobCorrupted):
        blobs.get_buffer(digest)
    with pytest.raises(BlobNotFound):
        blobs.get_buffer("1" * 64)


def test_a_linked_file_with_its_writers_digest_is_not_read_and_a_wrong_digest_is_never_served(
        blobs: LocalBlobStore, tmp_path, monkeypatch):
    import dart.blobs

    ckpt = tmp_path / "step-1" / "model.safetensors"
    ckpt.parent.mkdir()
    data = os.urandom(50_000)
    ckpt.write_bytes(data)
    right = hashlib.sha256(data).hexdigest()

    def no_read(_path):
        raise AssertionError("hashed the file although its writer gave the digest")
    with monkeypatch.context() as m:
        m.setattr(dart.blobs, "_hash_file", no_read)
        assert blobs.put_file(ckpt, link=True, digest=right) == right
        wrong = blobs.put_file(ckpt, link=True, digest="e" * 64)      # a writer that lied
    assert blobs.local_path(right).stat().st_ino == ckpt.stat().st_ino and blobs.get_buffer(right) == data
    for read in (blobs.get, blobs.get_buffer, blobs.local_path):
        with pytest.raises(BlobCorrupted):
            read(wrong)
    with pytest.raises(BlobError, match="link=True"):
        blobs.put_file(ckpt, digest=right)                             # trusted only for a committed file

    def refuse(*_a, **_kw):
        raise OSError(18, "Invalid cross-device link")
    monkeypatch.setattr(os, "link", refuse)                            # copied instead: the copy is checked
    with pytest.raises(BlobCorrupted, match="changed since written"):
        blobs.put_file(ckpt, link=True, digest="d" * 64)
    assert not [p for p in blobs.root.rglob(".tmp-*")]
