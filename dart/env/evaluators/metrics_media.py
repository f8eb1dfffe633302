"""Image, VLC and archive metrics (OSWorld's ``gimp``, ``vlc`` and ``others`` metrics).

Pictures are read with Pillow; structural similarity is SSIM over 7x7 uniform windows on
grey levels (scikit-image's default), a picture "keeps its structure" at SSIM >= 0.9 as in
OSWorld. VLC settings come from its ``vlcrc``; unset keys take VLC's defaults.
"""

from __future__ import annotations

import io
import re
import zipfile
from collections.abc import Mapping
from typing import Any
from xml.etree import ElementTree

import numpy as np

from dart.env.evaluators.files import FileContent, as_file
from dart.env.evaluators.metrics_basic import as_text, need_expected
from dart.env.evaluators.metrics_docs import compare_docx_files, compare_pdfs
from dart.env.evaluators.registry import register_metric

SSIM_SAME = 0.9
"""SSIM at or above which two pictures count as the same structure."""


def image(value: Any, *, expected: bool = False) -> Any:
    """A Pillow image, or None for a missing / unreadable file (an expected one is required)."""
    from PIL import Image, UnidentifiedImageError

    f = as_file(need_expected(value, "image metric") if expected else value)
    if f is None:
        return None
    try:
        img = Image.open(io.BytesIO(f.data))
        img.load()
        return img
    except (UnidentifiedImageError, OSError):
        return None


def _box_mean(a: np.ndarray, k: int) -> np.ndarray:
    c = np.pad(a, ((1, 0), (1, 0))).cumsum(0).cumsum(1)
    return (c[k:, k:] - c[:-k, k:] - c[k:, :-k] + c[:-k, :-k]) / (k * k)


def ssim(a: Any, b: Any, k: int = 7) -> float:
    """Mean SSIM of two same-size pictures' grey levels (0 if the sizes differ)."""
    if a.size != b.size:
        return 0.0
    x = np.asarray(a.convert("L"), dtype=np.float64)
    y = np.asarray(b.convert("L"), dtype=np.float64)
    if min(x.shape) < k:
        return float(np.array_equal(x, y))
    c1, c2 = (0.01 * 255) ** 2, (0.03 * 255) ** 2
    mx, my = _box_mean(x, k), _box_mean(y, k)
    n = k * k
    vx = (_box_mean(x * x, k) - mx * mx) * n / (n - 1)
    vy = (_box_mean(y * y, k) - my * my) * n / (n - 1)
    cxy = (_box_mean(x * y, k) - mx * my) * n / (n - 1)
    s = ((2 * mx * my + c1) * (2 * cxy + c2)) / ((mx * mx + my * my + c1) * (vx + vy + c2))
    return float(s.mean())


@register_metric("compare_images")
def compare_images(result: Any, expected: Any = None, **options: Any) -> float:
    """1 if the pictures are pixel-identical; with ``reference_base_result`` (a similarity the
    unedited picture already reaches), 1 if the pixel similarity is above it."""
    from PIL import ImageChops

    want, got = image(expected, expected=True), image(result)
    if got is None or want is None or got.size != want.size:
        return 0.0
    a, b = got.convert("RGB"), want.convert("RGB")
    if "reference_base_result" in options:
        diff = np.abs(np.asarray(a, dtype=np.int16) - np.asarray(b, dtype=np.int16)).mean() / 255
        return float(1 - diff > float(options["reference_base_result"]))
    return float(ImageChops.difference(a, b).getbbox() is None)


@register_metric("check_structure_sim")
def check_structure_sim(result: Any, expected: Any = None, **options: Any) -> float:
    want, got = image(expected, expected=True), image(result)
    return float(got is not None and want is not None and ssim(got, want) >= SSIM_SAME)


@register_metric("check_file_exists_and_structure_sim")
def check_file_exists_and_structure_sim(result: Any, expected: Any = None, **options: Any) -> float:
    return check_structure_sim(result, expected)


@register_metric("check_structure_sim_resized")
def check_structure_sim_resized(result: Any, expected: Any = None, **options: Any) -> float:
    """The result, scaled back to the original's size, keeps its structure."""
    want, got = image(expected, expected=True), image(result)
    if got is None or want is None:
        return 0.0
    return float(ssim(got.convert("RGB").resize(want.size), want) >= SSIM_SAME)


@register_metric("check_image_mirror")
def check_image_mirror(result: Any, expected: Any = None, **options: Any) -> float:
    from PIL import ImageOps

    want, got = image(expected, expected=True), image(result)
    return float(got is not None and want is not None and ssim(got, ImageOps.mirror(want)) >= SSIM_SAME)


def _normalized(img: Any) -> Any:
    from PIL import Image

    g = np.asarray(img.convert("L"), dtype=np.float64)
    g = (g - g.mean()) / (g.std() or 1.0)
    return Image.fromarray(np.clip(g * 40 + 128, 0, 255).astype(np.uint8))


def _changed(result: Any, expected: Any, measure: Any, grew: bool) -> float:
    """The result's ``measure`` moved the wanted way, and its structure (contrast-normalised) is kept."""
    want, got = image(expected, expected=True), image(result)
    if got is None or want is None or got.size != want.size:
        return 0.0
    moved = measure(got) > measure(want) if grew else measure(got) < measure(want)
    return float(moved and ssim(_normalized(got), _normalized(want)) >= SSIM_SAME)


def _brightness(img: Any) -> float:
    return float(np.asarray(img.convert("L"), dtype=np.float64).mean())


def _contrast(img: Any) -> float:
    return float(np.asarray(img.convert("L"), dtype=np.float64).std())


def _saturation(img: Any) -> float:
    return float(np.asarray(img.convert("RGB").convert("HSV"), dtype=np.float64)[..., 1].mean())


@register_metric("check_brightness_decrease_and_structure_sim")
def check_brightness_decrease(result: Any, expected: Any = None, **options: Any) -> float:
    return _changed(result, expected, _brightness, grew=False)


@register_metric("check_contrast_increase_and_structure_sim")
def check_contrast_increase(result: Any, expected: Any = None, **options: Any) -> float:
    return _changed(result, expected, _contrast, grew=True)


@register_metric("check_saturation_increase_and_structure_sim")
def check_saturation_increase(result: Any, expected: Any = None, **options: Any) -> float:
    return _changed(result, expected, _saturation, grew=True)


@register_metric("check_palette_and_structure_sim")
def check_palette_and_structure_sim(result: Any, expected: Any = None, **options: Any) -> float:
    """The result is a palette ('P' mode) picture with the original's structure."""
    want, got = image(expected, expected=True), image(result)
    return float(got is not None and want is not None and got.mode == "P" and ssim(got, want) >= SSIM_SAME)


@register_metric("check_image_size")
def check_image_size(result: Any, expected: Any = None, **options: Any) -> float:
    """The picture has ``rules.width`` / ``rules.height`` (of its opaque part with ``ignore_transparent``)."""
    rules = need_expected(expected, "check_image_size")
    img = image(result)
    if img is None:
        return 0.0
    w, h = img.size
    if rules.get("ignore_transparent") and img.mode in ("RGBA", "LA", "P"):
        box = img.convert("RGBA").getchannel("A").getbbox()
        w, h = (box[2] - box[0], box[3] - box[1]) if box else (0, 0)
    return float(all(rules.get(k) is None or rules[k] == v for k, v in (("width", w), ("height", h))))


@register_metric("check_image_file_size")
def check_image_file_size(result: Any, expected: Any = None, **options: Any) -> float:
    f = as_file(result)
    return float(f is not None and image(f) is not None and len(f.data) < need_expected(expected, "x")["max_size"])


_VLC_DEFAULTS = {"qt-bgcone": "1", "qt-max-volume": "125", "qt-minimal-view": "0", "global-key-play-pause": "",
                 "one-instance-when-started-from-file": "1", "input-record-path": "",
                 "qt-slider-colours": "153;210;153;20;210;20;255;199;15;245;39;29"}


def vlc_setting(vlcrc: Any, key: str) -> str | None:
    """A vlcrc key's value (VLC's default when the line is commented out), None without a file."""
    text = as_text(vlcrc)
    if text is None:
        return None
    m = re.search(rf"^{re.escape(key)}=(.*)$", text, re.MULTILINE)
    return m.group(1).strip() if m else _VLC_DEFAULTS.get(key, "")


def _vlc_metric(key: str, rule_key: str) -> Any:
    def metric(result: Any, expected: Any = None, **options: Any) -> float:
        value = vlc_setting(result, key)
        return float(value is not None and value == str(need_expected(expected, key)[rule_key]))

    metric.__doc__ = f"vlcrc's {key} equals rules.{rule_key}."
    return metric


for _name, _key, _rule in (
    ("check_qt_bgcone", "qt-bgcone", "expected_qt_bgcone"),
    ("check_qt_max_volume", "qt-max-volume", "expected_qt_max_volume"),
    ("check_qt_minimal_view", "qt-minimal-view", "expected_qt_minimal_view"),
    ("check_global_key_play_pause", "global-key-play-pause", "expected_global_key_play_pause"),
    ("check_one_instance_when_started_from_file", "one-instance-when-started-from-file",
     "expected_one_instance_when_started_from_file"),
    ("is_vlc_recordings_folder", "input-record-path", "recording_file_path"),
):
    register_metric(_name)(_vlc_metric(_key, _rule))


@register_metric("check_qt_slider_colours")
def check_qt_slider_colours(result: Any, expected: Any = None, **options: Any) -> float:
    """``type: blackish``: every slider colour is near black."""
    value = vlc_setting(result, "qt-slider-colours")
    try:
        levels = [int(v) for v in (value or "").split(";") if v]
    except ValueError:
        return 0.0
    if need_expected(expected, "check_qt_slider_colours").get("type") == "blackish":
        return float(bool(levels) and max(levels) <= 50)
    return 0.0


@register_metric("is_vlc_playing")
def is_vlc_playing(result: Any, expected: Any = None, **options: Any) -> float:
    """VLC's status.xml says playing, and the file name (``type: file_name``) or URL (``type: url``) matches."""
    rules = need_expected(expected, "is_vlc_playing")
    text = as_text(result)
    if not text:
        return 0.0
    try:
        root = ElementTree.fromstring(text)
    except ElementTree.ParseError:
        return 0.0
    if root.findtext("state") != "playing":
        return 0.0
    infos = {i.get("name"): (i.text or "") for i in root.iter("info")}
    if rules.get("type") == "file_name":
        return float(infos.get("filename") == rules.get("file_name"))
    if rules.get("type") == "url":
        return float(rules.get("url", "") in (infos.get("url", ""), infos.get("filename", "")))
    return 0.0


def _members(value: Any, *, expected: bool = False) -> dict[str, bytes] | None:
    f = as_file(need_expected(value, "archive metric") if expected else value)
    if f is None:
        return None
    try:
        with zipfile.ZipFile(io.BytesIO(f.data)) as z:
            return {n: z.read(n) for n in z.namelist() if not n.endswith("/")}
    except (zipfile.BadZipFile, OSError):
        return None


@register_metric("compare_zip_files")
def compare_zip_files(result: Any, expected: Any = None, **options: Any) -> float:
    """The archives hold the same member names with the same bytes."""
    want, got = _members(expected, expected=True), _members(result)
    return float(got is not None and got == want)


@register_metric("compare_archive")
def compare_archive(result: Any, expected: Any = None, **options: Any) -> float:
    """The .zip archives hold the same file names (under ``file_path``); members of
    ``file_type`` pdf / docx / text compare by content with that type's metric, others by bytes."""
    want, got = _members(expected, expected=True), _members(result)
    if got is None or want is None:
        return 0.0
    prefix = str(options.get("file_path", "")).strip("/")

    def names(m: Mapping[str, bytes]) -> dict[str, str]:
        return {n.split(prefix + "/", 1)[-1] if prefix else n: n for n in m}

    ng, nw = names(got), names(want)
    if set(ng) != set(nw):
        return 0.0
    kind = options.get("file_type", "")
    scores = []
    for rel in nw:
        a, b = FileContent(rel, got[ng[rel]]), FileContent(rel, want[nw[rel]])
        if kind == "pdf":
            scores.append(compare_pdfs(a, b))
        elif kind == "docx":
            scores.append(compare_docx_files(a, b))
        else:
            scores.append(float(a.data == b.data))
    return sum(scores) / len(scores) if scores else 1.0
