"""Model coordinates <-> screen pixels for the two UI-TARS conventions, and point/box text.

- ``qwen25vl`` (UI-TARS-1.5 / Qwen2.5-VL): absolute pixels of the *smart-resized* image,
  ``x_screen = x * W / resized_W``;
- ``qwen2vl`` (UI-TARS 1.0 / Qwen2-VL): relative 0..1000, ``x_screen = x * W / 1000``.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Literal

from dart.errors import ConfigError

Convention = Literal["qwen25vl", "qwen2vl"]
CONVENTIONS: tuple[str, ...] = ("qwen25vl", "qwen2vl")
FACTOR = 28
MIN_PIXELS = 100 * 28 * 28
MAX_PIXELS = 16384 * 28 * 28
MAX_ASPECT_RATIO = 200
RELATIVE_SCALE = 1000
"""Qwen2-VL coordinates run from 0 to this value on both axes."""


def smart_resize(
    height: int, width: int, factor: int = FACTOR, min_pixels: int = MIN_PIXELS, max_pixels: int = MAX_PIXELS
) -> tuple[int, int]:
    """(height, width) of the image Qwen2.5-VL sees: multiples of ``factor``, pixel count
    within [min_pixels, max_pixels], aspect ratio kept (1080x1920 -> (1092, 1932))."""
    if height <= 0 or width <= 0:
        raise ConfigError(f"image size must be positive, got height={height} width={width}")
    if max(height, width) / min(height, width) > MAX_ASPECT_RATIO:
        raise ConfigError(f"aspect ratio of {width}x{height} exceeds {MAX_ASPECT_RATIO}")
    h_bar = max(factor, round(height / factor) * factor)
    w_bar = max(factor, round(width / factor) * factor)
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt(height * width / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


@dataclass(frozen=True, kw_only=True, slots=True)
class Frame:
    """Maps model coordinates to screen pixels and back for one screen and convention."""

    screen_w: int
    screen_h: int
    model_w: int
    model_h: int

    @classmethod
    def of(
        cls,
        screen: tuple[int, int],
        convention: str = "qwen25vl",
        *,
        factor: int = FACTOR,
        min_pixels: int = MIN_PIXELS,
        max_pixels: int = MAX_PIXELS,
    ) -> Frame:
        """``screen`` is (width, height) in pixels."""
        w, h = (int(v) for v in screen)
        if convention == "qwen25vl":
            mh, mw = smart_resize(h, w, factor, min_pixels, max_pixels)
        elif convention == "qwen2vl":
            if w <= 0 or h <= 0:
                raise ConfigError(f"screen must be positive, got {w}x{h}")
            mw = mh = RELATIVE_SCALE
        else:
            raise ConfigError(f"convention must be one of {CONVENTIONS}, got {convention!r}")
        return cls(screen_w=w, screen_h=h, model_w=mw, model_h=mh)

    def to_screen(self, x: float, y: float) -> tuple[float, float]:
        """Model coordinates -> screen pixels, clamped onto the screen."""
        sx = x * self.screen_w / self.model_w
        sy = y * self.screen_h / self.model_h
        return min(max(sx, 0.0), self.screen_w - 1.0), min(max(sy, 0.0), self.screen_h - 1.0)

    def to_model(self, x: float, y: float) -> tuple[int, int]:
        """Screen pixels -> the nearest integer model coordinates."""
        return round(x * self.model_w / self.screen_w), round(y * self.model_h / self.screen_h)


_POINT_TOKENS = re.compile(r"<\|box_start\|>|<\|box_end\|>|</?point>|</?bbox>|[()\[\]]")
_NUMBERS = re.compile(r"\s*(\d+(?:\.\d+)?)(?:\s*,\s*|\s+|\s*$)")


def parse_point(value: str, frame: Frame) -> tuple[float, float]:
    """Screen point of ``'(x,y)'``, ``'<|box_start|>(x,y)<|box_end|>'``, ``'<point>x y</point>'``,
    ``'x1, y1, x2, y2'``, ``'(x1,y1,x2,y2)'`` or ``'<bbox>x1 y1 x2 y2</bbox>'`` (a box means its
    centre). Raises ValueError on anything else."""
    body = _POINT_TOKENS.sub(" ", value).strip()
    nums: list[float] = []
    pos = 0
    while pos < len(body):
        m = _NUMBERS.match(body, pos)
        if m is None or m.end() == pos:
            raise ValueError(f"not a point or box: {value!r}")
        nums.append(float(m.group(1)))
        pos = m.end()
    if len(nums) == 2:
        x, y = nums
    elif len(nums) == 4:
        x, y = (nums[0] + nums[2]) / 2, (nums[1] + nums[3]) / 2
    else:
        raise ValueError(f"a point needs 2 numbers and a box 4, got {len(nums)} in {value!r}")
    if not (math.isfinite(x) and math.isfinite(y)):
        raise ValueError(f"coordinates out of range in {value!r}")
    return frame.to_screen(x, y)
