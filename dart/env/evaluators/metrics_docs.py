"""Writer and PDF metrics: .docx read with python-docx (.odt with odfpy), PDFs with pypdf,
fuzzy ratios with rapidfuzz (OSWorld's ``docs`` and ``pdf`` metrics).

A missing or unreadable result scores 0; an unreadable gold file is an infra error.
"""

from __future__ import annotations

import io
import re
from typing import Any

from rapidfuzz import fuzz

from dart.env.evaluators.files import FileContent, as_file
from dart.env.evaluators.registry import register_metric
from dart.errors import EnvError


def open_docx(value: Any, *, expected: bool = False) -> Any:
    """A python-docx Document, or None for a missing / unreadable result."""
    import docx

    f = as_file(value)
    if f is None:
        if expected:
            raise EnvError("the expected document could not be fetched")
        return None
    try:
        return docx.Document(io.BytesIO(f.data))
    except Exception as exc:  # python-docx raises zipfile, KeyError, lxml and ValueError alike
        if expected:
            raise EnvError(f"the expected document {f.path} is unreadable: {exc}") from exc
        return None


def _odt_paragraphs(f: FileContent) -> list[str]:
    from odf import teletype, text
    from odf.opendocument import load

    doc = load(io.BytesIO(f.data))
    return [teletype.extractText(p) for p in doc.getElementsByType(text.P)]


def paragraphs(value: Any, *, expected: bool = False) -> list[str] | None:
    """Paragraph texts of a .docx or .odt file (None for a missing / unreadable result)."""
    f = as_file(value)
    if f is not None and f.suffix == ".odt":
        try:
            return _odt_paragraphs(f)
        except Exception as exc:  # odfpy raises zipfile and xml errors alike
            if expected:
                raise EnvError(f"the expected document {f.path} is unreadable: {exc}") from exc
            return None
    doc = open_docx(value, expected=expected)
    return None if doc is None else [p.text for p in doc.paragraphs]


def _squash(paras: list[str], ignore_case: bool) -> str:
    text = re.sub(r"\s+", " ", "\n".join(paras)).strip()
    return text.lower() if ignore_case else text


@register_metric("compare_docx_files")
def compare_docx_files(result: Any, expected: Any = None, **options: Any) -> float:
    """OSWorld's text comparison of two documents. ``content_only``: the fuzzy ratio of the
    whitespace-squashed texts; ``ignore_blanks`` (default on): squashed texts equal (or their
    ratio with ``fuzzy_match``); otherwise paragraph by paragraph. ``ignore_order`` sorts
    paragraphs, ``delete_empty_lines`` drops empty ones, ``ignore_case`` lower-cases."""
    want = paragraphs(expected, expected=True)
    got = paragraphs(result)
    if got is None or want is None:
        return 0.0
    ignore_case = bool(options.get("ignore_case", False))
    fuzzy = bool(options.get("fuzzy_match", False))
    if options.get("delete_empty_lines", False):
        got, want = [p for p in got if p.strip()], [p for p in want if p.strip()]
    if options.get("ignore_order", False):
        got, want = sorted(got), sorted(want)
    if options.get("content_only", False):
        return fuzz.ratio(_squash(got, ignore_case), _squash(want, ignore_case)) / 100.0
    if options.get("ignore_blanks", True):
        a, b = _squash(got, ignore_case), _squash(want, ignore_case)
        if fuzzy:
            return fuzz.ratio(a, b) / 100.0
        return 1.0 if a == b else 0.0
    if len(got) != len(want):
        return 0.0
    for p1, p2 in zip(got, want, strict=True):
        if ignore_case:
            p1, p2 = p1.lower(), p2.lower()
        if (fuzz.ratio(p1, p2) < 80) if fuzzy else (p1 != p2):
            return 0.0
    return 1.0


@register_metric("compare_docx_files_and_ignore_new_lines")
def compare_docx_files_and_ignore_new_lines(result: Any, expected: Any = None, **options: Any) -> float:
    """Texts equal once empty paragraphs are dropped (``ignore_blanks``: whitespace squashed)."""
    want = paragraphs(expected, expected=True)
    got = paragraphs(result)
    if got is None or want is None:
        return 0.0
    got, want = [p for p in got if p.strip()], [p for p in want if p.strip()]
    if options.get("ignore_blanks", True):
        return 1.0 if _squash(got, False) == _squash(want, False) else 0.0
    return 1.0 if got == want else 0.0


@register_metric("compare_docx_tables")
def compare_docx_tables(result: Any, expected: Any = None, **options: Any) -> float:
    """1 if both documents have the same tables, shape and cell texts (stripped)."""
    want = open_docx(expected, expected=True)
    got = open_docx(result)
    if got is None or len(got.tables) != len(want.tables):
        return 0.0
    for t1, t2 in zip(got.tables, want.tables, strict=True):
        rows1 = [[c.text.strip() for c in r.cells] for r in t1.rows]
        rows2 = [[c.text.strip() for c in r.cells] for r in t2.rows]
        if rows1 != rows2:
            return 0.0
    return 1.0


@register_metric("compare_line_spacing")
def compare_line_spacing(result: Any, expected: Any = None, **options: Any) -> float:
    """Same text, and every paragraph's line spacing equal."""
    if not compare_docx_files(result, expected):
        return 0.0
    got, want = open_docx(result), open_docx(expected, expected=True)
    if got is None or len(got.paragraphs) != len(want.paragraphs):
        return 0.0
    return float(all(p1.paragraph_format.line_spacing == p2.paragraph_format.line_spacing
                     for p1, p2 in zip(got.paragraphs, want.paragraphs, strict=True)))


def _images(doc: Any) -> list[bytes]:
    return [rel.target_part.blob for rel in doc.part.rels.values() if "image" in rel.reltype]


@register_metric("compare_docx_images")
def compare_docx_images(result: Any, expected: Any = None, **options: Any) -> float:
    """1 if both documents embed the same images (bytes), in the same order."""
    want = open_docx(expected, expected=True)
    got = open_docx(result)
    if got is None:
        return 0.0
    return 1.0 if _images(got) == _images(want) else 0.0


def pdf_text(value: Any, *, expected: bool = False) -> str | None:
    """All text of a PDF (pypdf), None for a missing / unreadable result."""
    from pypdf import PdfReader

    f = as_file(value)
    if f is None:
        if expected:
            raise EnvError("the expected PDF could not be fetched")
        return None
    try:
        return "".join(page.extract_text() or "" for page in PdfReader(io.BytesIO(f.data)).pages)
    except Exception as exc:  # pypdf raises its own errors, zlib and struct errors alike
        if expected:
            raise EnvError(f"the expected PDF {f.path} is unreadable: {exc}") from exc
        return None


@register_metric("compare_pdfs")
def compare_pdfs(result: Any, expected: Any = None, **options: Any) -> float:
    """Fuzzy ratio of the PDFs' texts (for lists: the mean over the pairs)."""
    pairs = (list(zip(result, expected, strict=False)) if isinstance(expected, list) and isinstance(result, list)
             else [(result, expected)])
    if not pairs:
        return 0.0
    total = 0.0
    for got, want in pairs:
        b = pdf_text(want, expected=True)
        a = pdf_text(got)
        total += 0.0 if a is None or b is None else fuzz.ratio(a, b) / 100.0
    return total / len(pairs)


@register_metric("check_pdf_pages")
def check_pdf_pages(result: Any, expected: Any = None, **options: Any) -> float:
    """1 if the PDF has ``rules.relative_nums``... OSWorld: the page count equals ``expected``."""
    from pypdf import PdfReader

    f = as_file(result)
    if f is None:
        return 0.0
    try:
        n = len(PdfReader(io.BytesIO(f.data)).pages)
    except Exception:  # an unreadable result is a plain failure
        return 0.0
    want = expected.get("expected") if isinstance(expected, dict) else expected
    return 1.0 if n == int(want) else 0.0
