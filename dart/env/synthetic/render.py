"""Draw a synthetic screen state as a PNG with PIL (pure: same spec + state, same bytes)."""

from __future__ import annotations

import functools
import io
from typing import Any

from PIL import Image, ImageDraw, ImageFont

from dart.env.synthetic.screen import Spec, State, list_row_box, visible_items, widgets_on_page

_INK = (30, 30, 30)
_FIELD = (255, 255, 255)
_FOCUS = (30, 110, 230)
_SELECTED = (120, 170, 240)


@functools.lru_cache(maxsize=16)
def _font(size: int) -> ImageFont.FreeTypeFont | ImageFont.ImageFont:
    return ImageFont.load_default(size=size)


def render_png(spec: Spec, state: State) -> bytes:
    """PNG bytes of the current page of ``state``."""
    img = render_image(spec, state)
    buf = io.BytesIO()
    img.save(buf, format="PNG", compress_level=1)
    return buf.getvalue()


def render_image(spec: Spec, state: State) -> Image.Image:
    width, height = int(spec["width"]), int(spec["height"])
    img = Image.new("RGB", (width, height), tuple(spec.get("background", (236, 236, 236))))
    draw = ImageDraw.Draw(img)
    font = _font(int(spec.get("font_size", 10)))
    for w in widgets_on_page(spec, state["page"]):
        _draw_widget(draw, font, w, state)
    if state.get("done"):
        # A finished screen looks finished: the policy can learn that nothing is left to do.
        draw.rectangle([0, 0, width - 1, height - 1], outline=(20, 20, 20), width=3)
    return img


def _draw_widget(draw: ImageDraw.ImageDraw, font: Any, w: dict[str, Any], state: State) -> None:
    x0, y0, x1, y1 = (int(v) for v in w["box"])
    focused = state.get("focus") == w.get("name")
    match w["kind"]:
        case "label":
            draw.text((x0, y0), str(w.get("text", "")), fill=_INK, font=font)
        case "panel":
            draw.rectangle([x0, y0, x1 - 1, y1 - 1], fill=tuple(w.get("color", (236, 236, 236))))
        case "button":
            color = tuple(w.get("color", (200, 200, 200)))
            pressed = w["name"] in state.get("pressed", ())
            draw.rounded_rectangle([x0, y0, x1, y1], radius=4, fill=color, outline=_INK, width=3 if pressed else 1)
            _centered(draw, font, (x0, y0, x1, y1), str(w.get("label", "")), _text_color(color))
        case "checkbox":
            label = str(w.get("label", ""))
            # A labelled box is a form row; an unlabelled one is a big target filling its box.
            side = min(y1 - y0, 16) if label else min(y1 - y0, x1 - x0)
            bx0, by0 = x0, y0 + (y1 - y0 - side) // 2
            color = tuple(w.get("color", _FIELD))
            draw.rectangle([bx0, by0, bx0 + side, by0 + side], fill=color, outline=_FOCUS if focused else _INK, width=2)
            if state["values"].get(w["name"]):
                draw.line([bx0 + 2, by0 + 2, bx0 + side - 2, by0 + side - 2], fill=_INK, width=3)
                draw.line([bx0 + 2, by0 + side - 2, bx0 + side - 2, by0 + 2], fill=_INK, width=3)
            if label:
                draw.text((bx0 + side + 4, by0 + (side - 10) // 2), label, fill=_INK, font=font)
        case "textfield":
            label = str(w.get("label", ""))
            draw.rectangle([x0, y0, x1, y1], fill=_FIELD, outline=_FOCUS if focused else _INK, width=2 if focused else 1)
            value = str(state["values"].get(w["name"], ""))
            shown = value if value else label
            draw.text((x0 + 4, y0 + (y1 - y0 - 10) // 2), shown, fill=_INK if value else (150, 150, 150), font=font)
            if state.get("select_all") and focused and value:
                draw.rectangle([x0 + 2, y0 + 2, x1 - 2, y1 - 2], outline=_SELECTED, width=2)
        case "list":
            draw.rectangle([x0, y0, x1, y1], fill=_FIELD, outline=_FOCUS if focused else _INK)
            offset = state["list_offset"].get(w["name"], 0)
            selected = state["values"].get(w["name"])
            for row, item in enumerate(visible_items(w, offset)):
                rx0, ry0, rx1, ry1 = (int(v) for v in list_row_box(w, row))
                if item == selected:
                    draw.rectangle([rx0 + 1, ry0 + 1, rx1 - 1, ry1 - 1], fill=_SELECTED)
                draw.text((rx0 + 4, ry0 + (ry1 - ry0 - 10) // 2), item, fill=_INK, font=font)
            if offset > 0:
                draw.polygon([(x1 - 10, y0 + 8), (x1 - 4, y0 + 8), (x1 - 7, y0 + 3)], fill=_INK)
            if offset + len(visible_items(w, offset)) < len(w["items"]):
                draw.polygon([(x1 - 10, y1 - 8), (x1 - 4, y1 - 8), (x1 - 7, y1 - 3)], fill=_INK)


def _centered(draw: ImageDraw.ImageDraw, font: Any, box: tuple[int, int, int, int], text: str, fill: Any) -> None:
    if not text:
        return
    left, top, right, bottom = draw.textbbox((0, 0), text, font=font)
    x0, y0, x1, y1 = box
    x = x0 + (x1 - x0 - (right - left)) / 2 - left
    y = y0 + (y1 - y0 - (bottom - top)) / 2 - top
    draw.text((x, y), text, fill=fill, font=font)


def _text_color(bg: tuple[int, ...]) -> tuple[int, int, int]:
    luminance = 0.299 * bg[0] + 0.587 * bg[1] + 0.114 * bg[2]
    return (0, 0, 0) if luminance > 150 else (255, 255, 255)
