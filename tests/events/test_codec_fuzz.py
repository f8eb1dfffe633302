"""The Avro event decoder on hostile bytes: a DecodeError (never another exception, a hang or a
huge allocation), whatever arrives. Examples per test come from the hypothesis profile
(tests/conftest.py: bounded in `make test`, long in `make fuzz`)."""

from __future__ import annotations

import time

from hypothesis import given
from hypothesis import strategies as st

from dart.errors import DecodeError
from dart.events import decode, encode
from dart.events.codec import HEADER_BYTES, MARKER
from dart.events.examples import all_examples

ENCODED = [encode(e) for e in all_examples()]
HEADERS = sorted({data[:HEADER_BYTES] for data in ENCODED})


def decodes_or_refuses(data: bytes) -> None:
    t0 = time.perf_counter()
    try:
        decode(data)
    except DecodeError as exc:
        assert str(exc)
    assert time.perf_counter() - t0 < 1.0, f"decoding {len(data)} bytes took too long"


@given(st.binary(max_size=2048))
def test_arbitrary_bytes_are_a_decode_error(data):
    decodes_or_refuses(data)


@given(header=st.sampled_from(HEADERS), body=st.binary(max_size=4096))
def test_a_known_schema_with_a_random_body_is_an_event_or_a_decode_error(header, body):
    decodes_or_refuses(header + body)


@given(data=st.sampled_from(ENCODED), cut=st.integers(0, 10_000), flips=st.lists(
    st.tuples(st.integers(0, 10_000), st.integers(1, 255)), max_size=8))
def test_truncated_or_bit_flipped_real_events_are_events_or_decode_errors(data, cut, flips):
    buf = bytearray(data[: cut % (len(data) + 1)])
    for pos, xor in flips:
        if buf:
            buf[pos % len(buf)] ^= xor
    decodes_or_refuses(bytes(buf))


@given(header=st.sampled_from(HEADERS), varint=st.integers(2**28, 2**62))
def test_huge_declared_lengths_do_not_allocate_or_loop(header, varint):
    # Avro zig-zag varint of a huge length/count, followed by almost nothing.
    n = varint << 1
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    for prefix in (b"", b"\x02a", bytes(16)):
        decodes_or_refuses(header + prefix + bytes(out) + b"\x00")


def test_none_and_empty_and_marker_only_are_decode_errors():
    for data in (None, b"", MARKER, MARKER + b"\x00" * 8):
        try:
            decode(data)
        except DecodeError:
            continue
        raise AssertionError(f"{data!r} decoded")
