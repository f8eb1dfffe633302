"""Single-task picture, slide, audio-tag, e-book and PDF checks (OSWorld's ``gimp``,
``slides``, ``vlc`` and ``others`` metrics that one task each uses).

Pictures with Pillow + numpy, decks with python-pptx, MP3 tags with mutagen, PDFs with pypdf.
A missing or unreadable result scores 0.
"""

from __future__ import annotations

import io
import re
import zipfile
from typing import Any

import numpy as np

from dart.env.evaluators.files import as_file
from dart.env.evaluators.metrics_basic import need_expected
from dart.env.evaluators.metrics_json import match_rule
from dart.env.evaluators.metrics_media import compare_images, image
from dart.env.evaluators.metrics_slides import open_pptx
from dart.env.evaluators.registry import register_metric


def _foreground(img: Any, tol: int = 30) -> np.ndarray:
    """Pixels that differ from the picture's corner colour (its background)."""
    a = np.asarray(img.convert("RGB"), dtype=np.int16)
    return np.abs(a - a[0, 0]).sum(axis=2) > tol


@register_metric("check_triangle_position")
def check_triangle_position(result: Any, expected: Any = None, **options: Any) -> float:
    """The drawn shape's centre is the picture's centre (within 5% of each side)."""
    img = image(result)
    if img is None:
        return 0.0
    ys, xs = np.nonzero(_foreground(img))
    if not len(xs):
        return 0.0
    h, w = _foreground(img).shape
    return float(abs(xs.mean() - w / 2) <= 0.05 * w and abs(ys.mean() - h / 2) <= 0.05 * h)


@register_metric("check_textbox_on_leftside")
def check_textbox_on_leftside(result: Any, expected: Any = None, **options: Any) -> float:
    """Everything drawn on the picture lies in its left half."""
    img = image(result)
    if img is None:
        return 0.0
    xs = np.nonzero(_foreground(img))[1]
    return float(bool(len(xs)) and xs.max() < img.size[0] / 2)


@register_metric("check_green_background")
def check_green_background(result: Any, expected: Any = None, **options: Any) -> float:
    """Where the original is background (its corner colour), the result is green."""
    want, got = image(expected, expected=True), image(result)
    if got is None or want is None or got.size != want.size:
        return 0.0
    background = ~_foreground(want)
    rgb = np.asarray(got.convert("RGB"), dtype=np.int16)[background]
    green = (rgb[:, 1] > 128) & (rgb[:, 1] > rgb[:, 0] + 50) & (rgb[:, 1] > rgb[:, 2] + 50)
    return float(bool(len(rgb)) and green.mean() > 0.95)


def _pictures(prs: Any) -> list[Any]:
    return [s for slide in prs.slides for s in slide.shapes if s.shape_type == 13]  # MSO_SHAPE_TYPE.PICTURE


@register_metric("check_image_stretch_and_center")
def check_image_stretch_and_center(result: Any, expected: Any = None, **options: Any) -> float:
    """Every picture fills its slide (stretched to the slide's size, at its origin)."""
    prs = open_pptx(result)
    if prs is None or not _pictures(prs):
        return 0.0
    w, h = prs.slide_width, prs.slide_height
    tol = 0.01 * max(w, h)
    return float(all(abs(p.left) <= tol and abs(p.top) <= tol and abs(p.width - w) <= tol and abs(p.height - h) <= tol
                     for p in _pictures(prs)))


_NAMED = {"red": (255, 0, 0), "green": (0, 128, 0), "blue": (0, 0, 255), "black": (0, 0, 0)}


def _near(rgb: Any, target: tuple[int, int, int], others: list[tuple[int, int, int]]) -> bool:
    c = np.array([int(str(rgb)[i:i + 2], 16) for i in (0, 2, 4)])
    d = np.abs(c - np.array(target)).sum()
    return all(d < np.abs(c - np.array(o)).sum() for o in others)


@register_metric("check_page_number_colors")
def check_page_number_colors(result: Any, expected: Any = None, **options: Any) -> float:
    """Every slide-number field is in ``rules.color`` (nearer to it than to the other named colours)."""
    prs = open_pptx(result)
    color = str(need_expected(expected, "check_page_number_colors").get("color", "red"))
    if prs is None or color not in _NAMED:
        return 0.0
    others = [v for k, v in _NAMED.items() if k != color]
    runs = [r for slide in prs.slides for s in slide.shapes if s.is_placeholder and s.has_text_frame
            and s.placeholder_format.type == 13  # PP_PLACEHOLDER.SLIDE_NUMBER
            for p in s.text_frame.paragraphs for r in p.runs]
    return float(bool(runs) and all(r.font.color and r.font.color.type is not None and r.font.color.rgb is not None
                                    and _near(r.font.color.rgb, _NAMED[color], others) for r in runs))


@register_metric("evaluate_presentation_fill_to_rgb_distance")
def evaluate_presentation_fill_to_rgb_distance(result: Any, expected: Any = None, **options: Any) -> float:
    """Every slide's background is a solid fill nearer to ``rules.rgb`` than to ``rules.original_rgb``."""
    rules = need_expected(expected, "evaluate_presentation_fill_to_rgb_distance")
    prs = open_pptx(result)
    if prs is None:
        return 0.0
    target, original = tuple(rules.get("rgb", (0, 0, 0))), tuple(rules.get("original_rgb", (255, 255, 255)))
    for slide in prs.slides:
        fill = slide.background.fill
        try:
            rgb = fill.fore_color.rgb if fill.type == 1 else None  # MSO_FILL.SOLID
        except (AttributeError, TypeError):
            rgb = None
        if rgb is None or not _near(rgb, target, [original]):
            return 0.0
    return 1.0


@register_metric("check_mp3_meta")
def check_mp3_meta(result: Any, expected: Any = None, **options: Any) -> float:
    """The MP3's ID3 tags (title, artist, album ...) match ``rules`` (each ``{method, ref}``)."""
    import mutagen
    from mutagen.easyid3 import EasyID3

    f = as_file(result)
    if f is None:
        return 0.0
    try:
        tags = mutagen.File(io.BytesIO(f.data), easy=True)
    except mutagen.MutagenError:
        tags = None
    if tags is None:  # no audio frame mutagen can sync to: the ID3 tags still say what it is named
        try:
            tags = EasyID3(io.BytesIO(f.data))
        except mutagen.MutagenError:
            return 0.0
    if tags is None:
        return 0.0
    rules = need_expected(expected, "check_mp3_meta")
    return float(all(match_rule((tags.get(k) or [None])[0], str(r.get("method", "eq")), r.get("ref"))
                     for k, r in rules.items()))


def _epub_texts(value: Any, *, expected: bool = False) -> dict[str, str] | None:
    f = as_file(need_expected(value, "compare_epub") if expected else value)
    if f is None:
        return None
    try:
        with zipfile.ZipFile(io.BytesIO(f.data)) as z:
            return {n: re.sub(r"<[^>]+>|\s+", " ", z.read(n).decode("utf-8", "replace")).strip()
                    for n in sorted(z.namelist()) if n.endswith((".xhtml", ".html", ".htm"))}
    except (zipfile.BadZipFile, OSError):
        return None


@register_metric("compare_epub")
def compare_epub(result: Any, expected: Any = None, **options: Any) -> float:
    """The e-books hold the same text in their (X)HTML chapters."""
    want, got = _epub_texts(expected, expected=True), _epub_texts(result)
    return float(got is not None and bool(got) and list(got.values()) == list((want or {}).values()))


@register_metric("compare_pdf_images")
def compare_pdf_images(result: Any, expected: Any = None, **options: Any) -> float:
    """The PDFs embed the same pictures (pixels), page by page."""
    from pypdf import PdfReader

    def pictures(value: Any) -> list[bytes] | None:
        f = as_file(value)
        if f is None:
            return None
        try:
            return [img.image.convert("RGB").tobytes() for page in PdfReader(io.BytesIO(f.data)).pages
                    for img in page.images]
        except Exception:  # pypdf and Pillow raise many kinds on broken files
            return None

    want, got = pictures(need_expected(expected, "compare_pdf_images")), pictures(result)
    return float(got is not None and want is not None and got == want)


@register_metric("is_vlc_fullscreen")
def is_vlc_fullscreen(result: Any, expected: Any = None, **options: Any) -> float:
    """VLC's window (``expected``: its size) covers the screen (``result``: its size)."""
    if not isinstance(result, dict) or not isinstance(expected, dict):
        return 0.0
    return float(expected.get("width", 0) >= result.get("width", 1) and expected.get("height", 0) >= result.get("height", 1))


@register_metric("compare_image_list")
def compare_image_list(result: Any, expected: Any = None, **options: Any) -> float:
    """Each result picture equals its expected picture (pixels)."""
    got = result if isinstance(result, list) else [result]
    want = need_expected(expected, "compare_image_list")
    want = want if isinstance(want, list) else [want]
    return float(len(got) == len(want) and all(compare_images(a, b) == 1.0 for a, b in zip(got, want, strict=True)))


TEST_SUITE_TIMEOUT_S = 120.0
"""Time limit of a task's Python test suite (check_python_file_by_test_suite)."""


@register_metric("check_python_file_by_test_suite")
def check_python_file_by_test_suite(result: Any, expected: Any = None, **options: Any) -> float:
    """The task's own test suite (``expected``, a Python file from the task's authors) passes on
    the result files: its ``test()`` (or ``options.test_function_name``) returns true, run in a
    fresh interpreter in a folder holding only those files."""
    import subprocess
    import sys
    import tempfile
    from pathlib import Path, PurePosixPath

    files = [as_file(f) for f in (result if isinstance(result, list) else [result])]
    suite = as_file(need_expected(expected, "check_python_file_by_test_suite"))
    if not files or any(f is None for f in files) or suite is None:
        return 0.0
    func = str(options.get("test_function_name", "test"))
    with tempfile.TemporaryDirectory() as tmp:
        for f in files:
            (Path(tmp) / PurePosixPath(f.path).name).write_bytes(f.data)
        (Path(tmp) / "dart_test_suite.py").write_bytes(suite.data)
        code = f"import sys, dart_test_suite as t; sys.exit(0 if t.{func}() else 1)"
        try:
            done = subprocess.run([sys.executable, "-c", code], cwd=tmp, capture_output=True,
                                  timeout=TEST_SUITE_TIMEOUT_S, check=False)
        except subprocess.TimeoutExpired:
            return 0.0
    return float(done.returncode == 0)
