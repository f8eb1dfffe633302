"""`dart serve` is bounded by pixels (issue 44): images are refused on their declared size
before any is decoded; per request the image count and the total pixels are bounded."""

from __future__ import annotations

import base64
import io
import resource
import struct
import time
import zlib

import pytest
from PIL import Image

from dart.rollout.server import BadRequest, ImageLimits, parse_request


def png_header(width: int, height: int) -> bytes:
    """A PNG that declares width x height and holds almost nothing (as an attacker's would)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    idat = zlib.compress(b"\x00" * 64)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0))
            + chunk(b"IDAT", idat) + chunk(b"IEND", b""))


def png(width: int, height: int) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (width, height), (200, 10, 10)).save(buf, format="PNG")
    return buf.getvalue()


def body(*images: bytes) -> dict:
    items = [{"type": "image_url", "image_url": {"url": "data:image/png;base64," + base64.b64encode(i).decode()}}
             for i in images]
    return {"messages": [{"role": "user", "content": [{"type": "text", "text": "go"}, *items]}]}


def test_images_past_the_pixel_budget_are_refused_before_decoding() -> None:
    req = parse_request(body(png(1920, 1080), png(640, 480)))
    assert [im.size for im in req.images] == [(1920, 1080), (640, 480)]
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.perf_counter()
    with pytest.raises(BadRequest, match=r"9000x9000 .*ImageLimits.max_pixels"):
        parse_request(body(png_header(9000, 9000)))
    with pytest.raises(BadRequest, match=r"ImageLimits.max_pixels"):
        parse_request(body(png(64, 64), png_header(9000, 9000), png_header(9000, 9000)))
    assert time.perf_counter() - t0 < 0.5
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss < 100_000  # KiB: nothing of 81 Mpx was decoded
    limits = ImageLimits()
    with pytest.raises(BadRequest, match=r"ImageLimits.max_images"):
        parse_request(body(*[png_header(8, 8)] * (limits.max_images + 1)))
    side = int((limits.max_pixels * 0.9) ** 0.5)  # each under the per-image budget, together over the total
    with pytest.raises(BadRequest, match=r"ImageLimits.max_total_pixels"):
        parse_request(body(*[png_header(side, side)] * 3), ImageLimits(max_total_pixels=2 * limits.max_pixels))
    with pytest.raises(BadRequest, match="not a readable"):
        parse_request(body(b"not an image"))
