"""Single-task Writer, Impress and LibreOffice-settings checks (OSWorld's ``docs``, ``slides``
and ``libreoffice`` metrics), on python-docx / python-pptx documents and the profile's
``registrymodifications.xcu``. A missing or unreadable result scores 0.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any
from xml.etree import ElementTree

from rapidfuzz import fuzz

from dart.env.evaluators.files import as_file
from dart.env.evaluators.metrics_basic import as_text, need_expected
from dart.env.evaluators.metrics_docs import compare_docx_files, open_docx, paragraphs
from dart.env.evaluators.metrics_slides import open_pptx
from dart.env.evaluators.registry import register_metric
from dart.env.evaluators.sheets import read_workbook

_W = "{http://schemas.openxmlformats.org/wordprocessingml/2006/main}"


def _rules(expected: Any, metric: str) -> Mapping[str, Any]:
    rules = need_expected(expected, metric)
    return rules if isinstance(rules, Mapping) else {"expected": rules}


@register_metric("is_first_line_centered")
def is_first_line_centered(result: Any, expected: Any = None, **options: Any) -> float:
    doc = open_docx(result)
    return float(doc is not None and bool(doc.paragraphs) and doc.paragraphs[0].alignment == 1)  # CENTER


@register_metric("has_page_numbers_in_footers")
def has_page_numbers_in_footers(result: Any, expected: Any = None, **options: Any) -> float:
    """Every section's footer holds a PAGE field (or at least a digit)."""
    doc = open_docx(result)
    if doc is None or not doc.sections:
        return 0.0
    for section in doc.sections:
        xml = ElementTree.tostring(section.footer._element, encoding="unicode")  # noqa: SLF001
        if "PAGE" not in xml and not any(ch.isdigit() for ch in section.footer.paragraphs[0].text if section.footer.paragraphs):
            return 0.0
    return 1.0


@register_metric("contains_page_break")
def contains_page_break(result: Any, expected: Any = None, **options: Any) -> float:
    """The document has ``rules.page_break_count`` page breaks."""
    doc = open_docx(result)
    if doc is None:
        return 0.0
    breaks = sum(1 for br in doc.element.body.iter(f"{_W}br") if br.get(f"{_W}type") == "page")
    return float(breaks == int(_rules(expected, "contains_page_break").get("page_break_count", -1)))


def _runs(doc: Any) -> list[Any]:
    runs = [r for p in doc.paragraphs for r in p.runs]
    runs += [r for t in doc.tables for row in t.rows for c in row.cells for p in c.paragraphs for r in p.runs]
    return runs


@register_metric("compare_font_names")
def compare_font_names(result: Any, expected: Any = None, **options: Any) -> float:
    """Every run with text uses ``rules.font_name``."""
    doc = open_docx(result)
    want = _rules(expected, "compare_font_names").get("font_name")
    return float(doc is not None and all(r.font.name == want for r in _runs(doc) if r.text.strip()))


@register_metric("evaluate_strike_through_last_paragraph")
def evaluate_strike_through_last_paragraph(result: Any, expected: Any = None, **options: Any) -> float:
    """Same text as the gold document, and every run of its last paragraph struck through."""
    doc = open_docx(result)
    if doc is None or not compare_docx_files(result, expected) or not doc.paragraphs:
        return 0.0
    last = next((p for p in reversed(doc.paragraphs) if p.text.strip()), None)
    return float(last is not None and all(r.font.strike for r in last.runs if r.text.strip()))


@register_metric("evaluate_colored_words_in_tables")
def evaluate_colored_words_in_tables(result: Any, expected: Any = None, **options: Any) -> float:
    """Same text as the gold document; in its tables, words starting with a vowel are red and
    the others blue (OSWorld's task rule)."""
    doc = open_docx(result)
    if doc is None or not compare_docx_files(result, expected):
        return 0.0
    for t in doc.tables:
        for row in t.rows:
            for cell in row.cells:
                for p in cell.paragraphs:
                    for r in p.runs:
                        word = r.text.strip()
                        if not word:
                            continue
                        rgb = str(r.font.color.rgb) if r.font.color and r.font.color.rgb else ""
                        want = "FF0000" if word[0].lower() in "aeiou" else "0000FF"
                        if rgb.upper() != want:
                            return 0.0
    return 1.0


@register_metric("compare_subscript_contains")
def compare_subscript_contains(result: Any, expected: Any = None, **options: Any) -> float:
    """Some run is subscript, and the text matches the gold document."""
    doc = open_docx(result)
    if doc is None or not compare_docx_files(result, expected):
        return 0.0
    return float(any(r.font.subscript for r in _runs(doc)))


@register_metric("check_italic_font_size_14")
def check_italic_font_size_14(result: Any, expected: Any = None, **options: Any) -> float:
    """Same text as the gold; paragraphs whose text starts like a heading ("Question") are
    italic in 14 pt, as the task asks."""
    doc = open_docx(result)
    if doc is None or not compare_docx_files(result, expected):
        return 0.0
    def ok(run: Any) -> bool:
        return bool(run.font.italic) and run.font.size is not None and run.font.size.pt == 14

    heads = [p for p in doc.paragraphs if p.text.strip().lower().startswith("question")]
    return float(all(ok(r) for p in heads for r in p.runs if r.text.strip()))


@register_metric("check_tabstops")
def check_tabstops(result: Any, expected: Any = None, **options: Any) -> float:
    """Same text as the gold; in each non-empty paragraph the tab splits ``word_number_split_by_tabstop``
    words off, and the paragraph has a right-aligned tab stop as in the gold."""
    doc, gold = open_docx(result), open_docx(expected, expected=True)
    if doc is None or not compare_docx_files(result, expected):
        return 0.0
    n = int(options.get("word_number_split_by_tabstop", 0))
    for p, g in zip(doc.paragraphs, gold.paragraphs, strict=False):
        if not p.text.strip():
            continue
        parts = p.text.split("\t")
        if len(parts) < 2 or len(parts[0].split()) != n:
            return 0.0
        stops = [(s.alignment, s.position) for s in p.paragraph_format.tab_stops]
        if stops != [(s.alignment, s.position) for s in g.paragraph_format.tab_stops]:
            return 0.0
    return 1.0


@register_metric("compare_references")
def compare_references(result: Any, expected: Any = None, **options: Any) -> float:
    """The text after a "References" heading matches the gold's (fuzzy ratio, scaled from
    ``reference_base_result``: that ratio or below scores 0)."""
    got, want = paragraphs(result), paragraphs(expected, expected=True)
    if got is None or want is None:
        return 0.0

    def refs(paras: list[str]) -> str:
        idx = next((i for i, p in enumerate(paras) if p.strip().lower().startswith(("reference", "bibliograph"))), None)
        return " ".join(paras[idx + 1:] if idx is not None else paras)

    ratio = fuzz.ratio(refs(got), refs(want)) / 100
    base = float(options.get("reference_base_result", 0.0))
    return max(0.0, (ratio - base) / (1 - base)) if base < 1 else float(ratio >= 1)


@register_metric("fuzzy_place_math")
def fuzzy_place_math(result: Any, expected: Any = None, **options: Any) -> float:
    """Every word of the document fuzzily matches (ratio >= 90) one of ``rules.expected``."""
    paras = paragraphs(result)
    want = _rules(expected, "fuzzy_place_math").get("expected", [])
    words = [w for p in paras or [] for w in p.split()]
    return float(bool(words) and all(any(fuzz.ratio(w, e) >= 90 for e in want) for w in words))


@register_metric("compare_conference_city_in_order")
def compare_conference_city_in_order(result: Any, expected: Any = None, **options: Any) -> float:
    """Column C of the first sheet (from row 2) names the expected cities in order (any of a list's names)."""
    f = as_file(result)
    if f is None:
        return 0.0
    try:
        rows = read_workbook(f.data)[0].rows
    except (ValueError, IndexError):
        return 0.0
    cities = [str(r[2]).strip() if len(r) > 2 and r[2] is not None else "" for r in rows[1:]]
    want = _rules(expected, "compare_conference_city_in_order").get("expected", [])
    if len(cities) < len(want):
        return 0.0
    return float(all(any(n.lower() in c.lower() for n in (w if isinstance(w, list) else [w]))
                     for c, w in zip(cities, want, strict=False)))


@register_metric("check_transition")
def check_transition(result: Any, expected: Any = None, **options: Any) -> float:
    """Slide ``rules.slide_idx`` has a ``rules.transition_type`` transition."""
    prs = open_pptx(result)
    rules = _rules(expected, "check_transition")
    if prs is None:
        return 0.0
    slides = list(prs.slides)
    idx = int(rules.get("slide_idx", 0))
    if not 0 <= idx < len(slides):
        return 0.0
    xml = ElementTree.tostring(slides[idx]._element, encoding="unicode")  # noqa: SLF001
    return float(re.search(rf"<[\w:]*{re.escape(str(rules.get('transition_type')))}\b", xml) is not None)


@register_metric("check_slide_orientation_Portrait")
def check_slide_orientation_portrait(result: Any, expected: Any = None, **options: Any) -> float:
    prs = open_pptx(result)
    return float(prs is not None and prs.slide_height > prs.slide_width)


def _xcu(result: Any, path_part: str, name: str) -> str | None:
    """A value of LibreOffice's registrymodifications.xcu (None if unset)."""
    text = as_text(result)
    if text is None:
        return None
    try:
        root = ElementTree.fromstring(text)
    except ElementTree.ParseError:
        return None
    oor = "{http://openoffice.org/2001/registry}"
    for item in root.iter("item"):
        if path_part in (item.get(f"{oor}path") or ""):
            for prop in item.iter("prop"):
                if prop.get(f"{oor}name") == name:
                    return prop.findtext("value")
    return None


@register_metric("check_presenter_console_disable")
def check_presenter_console_disable(result: Any, expected: Any = None, **options: Any) -> float:
    return float(_xcu(result, "PresenterScreen", "Enabled") == "false" or
                 _xcu(result, "Impress/Misc/Start", "EnablePresenterScreen") == "false")


@register_metric("check_auto_saving_time")
def check_auto_saving_time(result: Any, expected: Any = None, **options: Any) -> float:
    """The autosave interval is ``rules.minutes``."""
    want = _rules(expected, "check_auto_saving_time").get("minutes")
    value = _xcu(result, "Recovery/AutoSave", "TimeIntervall") or _xcu(result, "Save/Document", "AutoSaveTimeIntervall")
    return float(value is not None and str(value) == str(want))


@register_metric("find_default_font")
def find_default_font(result: Any, expected: Any = None, **options: Any) -> float:
    """Writer's default font is ``rules.font_name``."""
    want = _rules(expected, "find_default_font").get("font_name")
    return float(_xcu(result, "Writer/DefaultFont", "Standard") == want)


def _odt_highlighted_text(value: Any) -> tuple[str, bool] | None:
    """(the document's text, whether any span has a background colour) of an .odt file."""
    import io

    from odf import teletype, text
    from odf.opendocument import load
    from odf.style import Style, TextProperties

    f = as_file(value)
    if f is None:
        return None
    try:
        doc = load(io.BytesIO(f.data))
    except Exception:  # odfpy raises zipfile and xml errors alike
        return None
    marked = set()
    for st in doc.automaticstyles.getElementsByType(Style):
        for tp in st.getElementsByType(TextProperties):
            bg = tp.getAttribute("backgroundcolor")
            if bg and bg.lower() not in ("transparent", "#ffffff"):
                marked.add(st.getAttribute("name"))
    spans = doc.getElementsByType(text.Span)
    highlighted = any(s.getAttribute("stylename") in marked and teletype.extractText(s).strip() for s in spans)
    body = " ".join(teletype.extractText(p) for p in doc.getElementsByType(text.P))
    return " ".join(body.split()), highlighted


@register_metric("check_highlighted_words")
def check_highlighted_words(result: Any, expected: Any = None, **options: Any) -> float:
    """No word is highlighted any more, and the text is the gold document's."""
    got, want = _odt_highlighted_text(result), _odt_highlighted_text(need_expected(expected, "check_highlighted_words"))
    return float(got is not None and want is not None and not got[1] and got[0] == want[0])


@register_metric("compare_unique_train_records")
def compare_unique_train_records(result: Any, expected: Any = None, **options: Any) -> float:
    """The result lists each record (non-empty paragraph) once, and the same records as the gold
    (``expected``: the gold document, or [gold, original])."""
    gold = expected[0] if isinstance(expected, list) else expected
    got, want = paragraphs(result), paragraphs(gold, expected=True)
    if got is None or want is None:
        return 0.0
    got = [p.strip() for p in got if p.strip()]
    want = [p.strip() for p in want if p.strip()]
    return float(len(got) == len(set(got)) and set(got) == set(want))
