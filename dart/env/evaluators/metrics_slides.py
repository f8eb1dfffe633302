"""Impress metrics over .pptx files, read with python-pptx (OSWorld's ``slides`` metrics).

``compare_pptx_files`` walks both decks slide by slide and shape by shape and returns 0 at the
first difference in what its ``examine_*`` options ask for (each on by default except the
position checks, as in OSWorld), else 1. A result that is missing or not a .pptx scores 0; an
unreadable gold file is an infra error.
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from typing import Any

from dart.env.evaluators.files import as_file
from dart.env.evaluators.registry import register_metric
from dart.errors import EnvError

_ON = ("number_of_slides", "shape", "text", "indent", "font_name", "font_size", "font_bold", "font_italic",
       "color_rgb", "font_underline", "strike_through", "alignment", "bullets", "background_color", "note",
       "image_size")
_OFF = ("title_bottom_position", "table_bottom_position", "right_position", "top_position",
        "shape_for_shift_size", "modify_height")


def open_pptx(value: Any, *, expected: bool = False) -> Any:
    """A python-pptx Presentation, or None for a missing / unreadable result file."""
    from pptx import Presentation

    f = as_file(value)
    if f is None:
        if expected:
            raise EnvError("the expected presentation could not be fetched")
        return None
    try:
        return Presentation(io.BytesIO(f.data))
    except Exception as exc:  # python-pptx raises zipfile, KeyError, lxml errors alike
        if expected:
            raise EnvError(f"the expected presentation {f.path} is unreadable: {exc}") from exc
        return None


def _flags(options: dict[str, Any]) -> dict[str, bool]:
    flags = {k: bool(options.get(f"examine_{k}", True)) for k in _ON}
    flags.update({k: bool(options.get(f"examine_{k}", False)) for k in _OFF})
    return flags


def _shapes(shapes: Any) -> Iterator[Any]:
    """Shapes in order, group members in place of their group."""
    for s in shapes:
        if s.shape_type == 6 and hasattr(s, "shapes"):  # MSO_SHAPE_TYPE.GROUP
            yield from _shapes(s.shapes)
        else:
            yield s


def _color(font: Any) -> Any:
    try:
        return font.color.rgb if font.color and font.color.type is not None else None
    except AttributeError:
        return None


def _strike(run: Any) -> Any:
    return run.font._element.get("strike") if run.font._element is not None else None  # noqa: SLF001


def _runs_differ(p1: Any, p2: Any, f: dict[str, bool]) -> bool:
    for r1, r2 in zip(p1.runs, p2.runs, strict=False):
        checks = (
            ("font_name", r1.font.name, r2.font.name),
            ("font_size", r1.font.size, r2.font.size),
            ("font_bold", r1.font.bold, r2.font.bold),
            ("font_italic", r1.font.italic, r2.font.italic),
            ("color_rgb", _color(r1.font), _color(r2.font)),
            ("font_underline", r1.font.underline, r2.font.underline),
            ("strike_through", _strike(r1), _strike(r2)),
        )
        if any(f[name] and a != b for name, a, b in checks):
            return True
    return False


def _bullet(p: Any) -> Any:
    ppr = p._p.pPr  # noqa: SLF001  (python-pptx has no bullet API)
    if ppr is None:
        return None
    return tuple(c.tag.rsplit("}", 1)[-1] + str(sorted(c.attrib.items())) for c in ppr
                 if c.tag.rsplit("}", 1)[-1].startswith("bu"))


def _text_differs(s1: Any, s2: Any, f: dict[str, bool]) -> bool:
    if f["text"] and s1.text_frame.text.strip() != s2.text_frame.text.strip():
        return True
    for p1, p2 in zip(s1.text_frame.paragraphs, s2.text_frame.paragraphs, strict=False):
        if f["text"] and p1.text != p2.text:
            return True
        if f["alignment"] and p1.alignment != p2.alignment:
            return True
        if f["indent"] and p1.level != p2.level:
            return True
        if f["bullets"] and _bullet(p1) != _bullet(p2):
            return True
        if _runs_differ(p1, p2, f):
            return True
    return False


def _table_differs(t1: Any, t2: Any, f: dict[str, bool]) -> bool:
    rows1, rows2 = list(t1.rows), list(t2.rows)
    if len(rows1) != len(rows2):
        return True
    for r1, r2 in zip(rows1, rows2, strict=True):
        for c1, c2 in zip(r1.cells, r2.cells, strict=False):
            if f["text"] and c1.text != c2.text:
                return True
            for p1, p2 in zip(c1.text_frame.paragraphs, c2.text_frame.paragraphs, strict=False):
                if _runs_differ(p1, p2, f):
                    return True
    return False


def _geometry_differs(s1: Any, s2: Any, f: dict[str, bool], tol: float) -> bool:
    def off(a: Any, b: Any) -> bool:
        if a is None or b is None:
            return a != b
        return abs(a - b) > tol * max(abs(a), abs(b), 1)

    if f["shape"] and any(off(getattr(s1, k), getattr(s2, k)) for k in ("left", "top", "width", "height")):
        return True
    if f["top_position"] and off(s1.top, s2.top):
        return True
    if f["right_position"] and off((s1.left or 0) + (s1.width or 0), (s2.left or 0) + (s2.width or 0)):
        return True
    if f["modify_height"] and off(s1.height, s2.height):
        return True
    picture = s1.shape_type == 13  # MSO_SHAPE_TYPE.PICTURE
    return f["image_size"] and picture and (off(s1.width, s2.width) or off(s1.height, s2.height))


def _background(slide: Any) -> Any:
    try:
        fill = slide.background.fill
        return fill.fore_color.rgb if fill.type == 1 else fill.type  # MSO_FILL.SOLID
    except (AttributeError, TypeError):
        return None


def _notes(slide: Any) -> str:
    return slide.notes_slide.notes_text_frame.text.strip() if slide.has_notes_slide else ""


def _slide_differs(sl1: Any, sl2: Any, f: dict[str, bool], tol: float) -> bool:
    if f["background_color"] and _background(sl1) != _background(sl2):
        return True
    if f["note"] and _notes(sl1) != _notes(sl2):
        return True
    shapes1, shapes2 = list(_shapes(sl1.shapes)), list(_shapes(sl2.shapes))
    if (f["shape"] or f["text"]) and len(shapes1) != len(shapes2):
        return True
    for s1, s2 in zip(shapes1, shapes2, strict=False):
        if _geometry_differs(s1, s2, f, tol):
            return True
        if s1.has_text_frame != s2.has_text_frame or getattr(s1, "has_table", False) != getattr(s2, "has_table", False):
            return True
        if s1.has_text_frame and _text_differs(s1, s2, f):
            return True
        if getattr(s1, "has_table", False) and _table_differs(s1.table, s2.table, f):
            return True
    return False


@register_metric("compare_pptx_files")
def compare_pptx_files(result: Any, expected: Any = None, **options: Any) -> float:
    """1 if the result deck matches the expected one in every examined property, else 0.
    ``approximately_tolerance``: relative slack on positions and sizes (default exact)."""
    want = open_pptx(expected, expected=True)
    got = open_pptx(result)
    if got is None:
        return 0.0
    f = _flags(options)
    tol = float(options.get("approximately_tolerance", 0.0))
    if f["number_of_slides"] and len(got.slides) != len(want.slides):
        return 0.0
    for sl1, sl2 in zip(got.slides, want.slides, strict=False):
        if _slide_differs(sl1, sl2, f, tol):
            return 0.0
    return 1.0
