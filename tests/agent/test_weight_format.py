"""The weight format written tensor by tensor and read back as views of one buffer."""

from __future__ import annotations

import hashlib
import json
import struct

import pytest
import torch
from safetensors.torch import save

from dart.agent.weight_format import (
    CHUNKS_FILE,
    CONFIG_FILE,
    SUMS_FILE,
    WEIGHTS_FILE,
    safetensors_chunks,
    state_dict_from_buffer,
    write_weights,
)
from dart.blobs import LocalBlobStore, chunks
from dart.errors import BlobCorrupted
from dart.train.weight_send import BlobTransfer


def mixed_state() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {
        "model.embed_tokens.weight": torch.randn(300, 70, generator=g).to(torch.bfloat16),
        "lm_head.weight": torch.randn(7, 3, generator=g),
        "model.layers.0.mlp.up_proj.weight": torch.randn(9, 5, generator=g).half(),
        "position_ids": torch.arange(11),
        "mask": torch.tensor([True, False, True]),
        "scalar": torch.tensor(2.5, dtype=torch.float64),
        "empty": torch.zeros(0, 4, dtype=torch.uint8),
        "transposed": torch.randn(4, 6, generator=g).t(),           # not contiguous: packed on the way
        "schön.gewicht": torch.randn(2, generator=g),                # a non-ASCII name
    }


def test_the_streamed_file_is_byte_for_byte_what_safetensors_writes(tmp_path):
    state = mixed_state()
    expected = save({k: v.contiguous() for k, v in state.items()})
    assert b"".join(bytes(c) for c in safetensors_chunks(state)) == expected
    digests = write_weights(state, '{"model_type": "t"}', tmp_path)
    assert (tmp_path / WEIGHTS_FILE).read_bytes() == expected
    # the weights' address is the sha256 of their chunk list, each line one chunk's sha256
    listing = (tmp_path / CHUNKS_FILE).read_bytes()
    step = chunks.CHUNK_BYTES
    assert listing.decode().splitlines()[1:] == [hashlib.sha256(expected[i:i + step]).hexdigest()
                                                 for i in range(0, len(expected), step)]
    assert digests == {WEIGHTS_FILE: hashlib.sha256(listing).hexdigest(),
                       CONFIG_FILE: hashlib.sha256(b'{"model_type": "t"}').hexdigest()}
    assert (tmp_path / SUMS_FILE).read_text().splitlines() == [f"{digests[n]}  {n}" for n in (WEIGHTS_FILE, CONFIG_FILE)]
    with pytest.raises(ValueError, match="complex64"):
        write_weights({"c": torch.zeros(2, dtype=torch.complex64)}, "{}", tmp_path / "bad")


def test_a_written_checkpoint_is_published_by_link_under_the_address_its_writer_recorded(tmp_path, monkeypatch):
    import dart.blobs

    ckpt = tmp_path / "step-00000001"
    write_weights(mixed_state(), "{}", ckpt)
    store = LocalBlobStore(tmp_path / "blobs")
    with monkeypatch.context() as m:
        m.setattr(dart.blobs, "_hash_file", lambda _p: pytest.fail("the checkpoint was read to publish it"))
        m.setattr(chunks, "hash_file", lambda _p: pytest.fail("the checkpoint was read to publish it"))
        refs = BlobTransfer().publish(1, ckpt, store)
    addressed = {WEIGHTS_FILE: CHUNKS_FILE, CONFIG_FILE: CONFIG_FILE}     # the weights: by their chunk list
    for ref in refs:
        assert ref.digest == hashlib.sha256((ckpt / addressed[ref.name]).read_bytes()).hexdigest()
        assert store.local_path(ref.digest).stat().st_ino == (ckpt / ref.name).stat().st_ino
    assert bytes(store.get_buffer(refs[0].digest)) == (ckpt / WEIGHTS_FILE).read_bytes()


def test_the_blob_is_read_into_views_of_one_buffer_equal_to_the_state():
    state = mixed_state()
    buf = bytearray(save({k: v.contiguous() for k, v in state.items()}))
    got = state_dict_from_buffer(buf)
    assert list(got) == list(json.loads(buf[8:8 + struct.unpack_from("<Q", buf)[0]]))
    start = torch.frombuffer(buf, dtype=torch.uint8).data_ptr()
    for name, tensor in state.items():
        assert got[name].dtype == tensor.dtype and got[name].shape == tensor.shape
        assert torch.equal(got[name], tensor.contiguous())
        if got[name].numel():
            assert start <= got[name].data_ptr() < start + len(buf)     # a view, not a copy


def _blob(header: dict, data: bytes) -> bytearray:
    text = json.dumps(header).encode()
    return bytearray(struct.pack("<Q", len(text)) + text + data)


@pytest.mark.parametrize(("blob", "match"), [
    (bytearray(b"\x01\x02"), "2 bytes"),
    (bytearray(struct.pack("<Q", 1 << 40) + b"{}"), "header of"),
    (bytearray(struct.pack("<Q", 2) + b"[]"), "not an object"),
    (_blob({}, b""), "no tensors"),
    (_blob({"a": {"dtype": "C64", "shape": [1], "data_offsets": [0, 8]}}, b"\0" * 8), "bad entry"),
    (_blob({"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}}, b"\0" * 8), "does not fit"),
    (_blob({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
            "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}}, b"\0" * 12), "overlap"),
    (_blob({"a": {"dtype": "U8", "shape": [2], "data_offsets": [0, 2]}}, b"\0" * 5), "unaccounted"),
])
def test_a_blob_that_is_no_safetensors_file_is_refused(blob, match):
    with pytest.raises(BlobCorrupted, match=match):
        state_dict_from_buffer(blob)
