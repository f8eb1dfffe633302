"""compare_table rules beyond cell values, read from .xlsx files with openpyxl: ``sheet_print``,
``sheet_fuzzy``, ``chart``, ``pivot_table``, ``style``, ``freeze``, ``zoom``, ``row_props``,
``data_validation``, and check_cell's style props (``font_bold``, ``font_color``, ``bgcolor``,
``merge`` ...). A result that is not an .xlsx fails the rule (these live in the .xlsx parts).
"""

from __future__ import annotations

import io
from collections.abc import Callable, Mapping
from typing import Any

from rapidfuzz import fuzz

from dart.env.evaluators.sheets import Sheet

STYLE_PROPS = ("font_name", "font_size", "font_bold", "font_italic", "font_underline", "font_color", "bgcolor",
               "number_format", "merge")


def load_xlsx(data: bytes | None) -> Any:
    """An openpyxl workbook (formulas as written), or None if ``data`` is not an .xlsx."""
    import openpyxl

    if data is None:
        return None
    try:
        return openpyxl.load_workbook(io.BytesIO(data))
    except Exception:  # openpyxl raises zipfile, KeyError, lxml errors alike
        return None


def worksheet(wb: Any, ref: Any, other_wb: Any = None) -> Any:
    """The worksheet an OSWorld reference names: an int (result by index), ``RI0``/``EI0`` by
    index, ``RNname``/``ENname`` by name; ``other_wb`` is the expected workbook."""
    book = wb
    if isinstance(ref, str) and len(ref) >= 2 and ref[0] in "RE" and ref[1] in "IN":
        book = wb if ref[0] == "R" else other_wb
        key: Any = ref[2:] if ref[1] == "N" else int(ref[2:])
    else:
        key = int(ref)
    if book is None:
        return None
    if isinstance(key, str):
        return book[key] if key in book.sheetnames else None
    return book.worksheets[key] if 0 <= key < len(book.worksheets) else None


def _printed(v: Any, ignore_case: bool) -> str:
    if v is None:
        return ""
    if isinstance(v, float) and v.is_integer():
        v = int(v)
    text = str(v)
    return text.lower() if ignore_case else text


def sheet_print(a: Sheet | None, b: Sheet | None, rule: Mapping[str, Any]) -> bool:
    """The sheets read the same as text (what a print or CSV export shows)."""
    if a is None or b is None:
        return False
    ic = bool(rule.get("ignore_case"))
    rows_a = [[_printed(v, ic) for v in r] for r in a.rows]
    rows_b = [[_printed(v, ic) for v in r] for r in b.rows]
    return rows_a == rows_b


def _cells(ws: Any, rng: str) -> list[Any]:
    return [c.value for row in ws[rng] for c in (row if isinstance(row, tuple) else (row,))]


def _fuzzy_same(x: Any, y: Any, rule: Mapping[str, Any]) -> bool:
    a, b = "" if x is None else str(x), "" if y is None else str(y)
    if rule.get("trim_leadings"):
        a, b = a.lstrip(rule["trim_leadings"]), b.lstrip(rule["trim_leadings"])
    if rule.get("trim_trailings"):
        a, b = a.rstrip(rule["trim_trailings"]), b.rstrip(rule["trim_trailings"])
    if rule.get("ignore_case"):
        a, b = a.lower(), b.lower()
    kind = rule.get("type", "exact_match")
    if kind == "fuzzy_match":
        return fuzz.ratio(a, b) >= float(rule.get("threshold", 85))
    if kind == "includes":
        return b in a
    if kind == "included_by":
        return a in b
    return a == b


def sheet_fuzzy(ws_a: Any, ws_b: Any, rule: Mapping[str, Any]) -> bool:
    """Each sub-rule's ranges hold matching cells (exact_match, fuzzy_match with threshold,
    includes, included_by; trim and case options)."""
    if ws_a is None or ws_b is None:
        return False
    for sub in rule.get("rules", []):
        for rng in sub.get("range", []):
            pairs = zip(_cells(ws_a, rng), _cells(ws_b, rng), strict=False)
            if not all(_fuzzy_same(x, y, sub) for x, y in pairs):
                return False
    return True


def _title(chart: Any) -> str | None:
    try:
        runs = chart.title.tx.rich.p
    except AttributeError:
        return None
    return "".join(r.t for p in runs for r in (p.r or []))


def _chart_props(chart: Any, props: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for p in props:
        if p == "type":
            out[p] = chart.tagname
        elif p == "title":
            out[p] = _title(chart)
        elif p == "legend":
            out[p] = None if chart.legend is None else chart.legend.position
        elif p == "anchor":
            out[p] = getattr(getattr(chart.anchor, "_from", None), "col", None)
        else:  # series references ("xtitle" and others read the same way OSWorld's would differ)
            out[p] = [s.val.numRef.f if s.val and s.val.numRef else None for s in chart.series]
    return out


def charts(ws_a: Any, ws_b: Any, rule: Mapping[str, Any]) -> bool:
    """The sheets have the same charts in the listed ``chart_props`` (type, title, legend...)."""
    if ws_a is None or ws_b is None:
        return False
    props = list(rule.get("chart_props", ["type"]))
    a = [_chart_props(c, props) for c in ws_a._charts]  # noqa: SLF001 (openpyxl keeps read charts there)
    b = [_chart_props(c, props) for c in ws_b._charts]  # noqa: SLF001
    return len(a) == len(b) and sorted(map(repr, a)) == sorted(map(repr, b))


def _pivot(p: Any, props: list[str]) -> dict[str, Any]:
    fields = {
        "row_fields": lambda: [f.x for f in p.rowFields],
        "col_fields": lambda: [f.x for f in p.colFields],
        "filter": lambda: [f.fld for f in p.pageFields],
        "data_fields": lambda: [(f.fld, f.subtotal) for f in p.dataFields],
        "location": lambda: p.location.ref,
    }
    return {k: fields[k]() for k in props if k in fields}


def pivot_tables(ws_a: Any, ws_b: Any, rule: Mapping[str, Any]) -> bool:
    """The sheets have the same pivot tables in the listed ``pivot_props``."""
    if ws_a is None or ws_b is None:
        return False
    props = list(rule.get("pivot_props", ["row_fields", "col_fields", "data_fields", "filter"]))
    a = [_pivot(p, props) for p in ws_a._pivots]  # noqa: SLF001 (openpyxl keeps read pivots there)
    b = [_pivot(p, props) for p in ws_b._pivots]  # noqa: SLF001
    return bool(a) and len(a) == len(b) and sorted(map(repr, a)) == sorted(map(repr, b))


def _rgb(color: Any) -> Any:
    return None if color is None else getattr(color, "rgb", None)


def cell_style(ws: Any, coordinate: str, prop: str) -> Any:
    """One style property of a cell, as comparable values."""
    cell = ws[coordinate]
    match prop:
        case "font_name":
            return cell.font.name
        case "font_size":
            return cell.font.sz
        case "font_bold":
            return bool(cell.font.b)
        case "font_italic":
            return bool(cell.font.i)
        case "font_underline":
            return cell.font.u
        case "font_color":
            return _rgb(cell.font.color)
        case "bgcolor":
            return _rgb(cell.fill.fgColor) if cell.fill.fill_type else None
        case "number_format":
            return cell.number_format
        case "merge":
            return any(coordinate in r for r in ws.merged_cells.ranges)
    raise ValueError(f"unknown style prop {prop!r}")


def styles(ws_a: Any, ws_b: Any, rule: Mapping[str, Any]) -> bool:
    """Every used cell of either sheet has the same listed style ``props``."""
    if ws_a is None or ws_b is None:
        return False
    coords = {c.coordinate for ws in (ws_a, ws_b) for row in ws.iter_rows() for c in row if c.value is not None}
    return all(cell_style(ws_a, c, p) == cell_style(ws_b, c, p) for c in coords for p in rule.get("props", []))


def freeze(ws_a: Any, ws_b: Any, rule: Mapping[str, Any]) -> bool:
    return ws_a is not None and ws_b is not None and ws_a.freeze_panes == ws_b.freeze_panes


def row_props(ws_a: Any, ws_b: Any, rule: Mapping[str, Any]) -> bool:
    """Rows have the same listed ``props`` (hidden, height, outline_level)."""
    if ws_a is None or ws_b is None:
        return False
    rows = set(ws_a.row_dimensions) | set(ws_b.row_dimensions)
    return all(getattr(ws_a.row_dimensions[r], p, None) == getattr(ws_b.row_dimensions[r], p, None)
               for r in rows for p in rule.get("props", []))


def _dv_matches(dv: Any, props: Mapping[str, Any], match: Callable[[Any, str, Any], bool]) -> bool:
    for name, check in props.items():
        method, ref = check.get("method"), check.get("ref")
        if name == "ranges":
            value = str(dv.sqref)
            ok = value in ref if method == "spreadsheet_range" else match(value, method, ref)
        elif method == "str_set_eq":
            items = {s.strip().strip('"') for s in str(getattr(dv, name, "") or "").strip('"').split(",")}
            ok = items == set(ref)
        else:
            ok = match(getattr(dv, name, None), method, ref)
        if not ok:
            return False
    return True


def data_validation(ws: Any, rule: Mapping[str, Any], match: Callable[[Any, str, Any], bool]) -> bool:
    """Each ``dv_props`` entry is matched by one of the sheet's data validations."""
    if ws is None:
        return False
    dvs = list(ws.data_validations.dataValidation)
    return all(any(_dv_matches(dv, props, match) for dv in dvs) for props in rule.get("dv_props", []))


def zoom(ws: Any, rule: Mapping[str, Any], match: Callable[[Any, str, Any], bool]) -> bool:
    if ws is None:
        return False
    scale = ws.sheet_view.zoomScale or 100
    return match(scale, str(rule.get("method", "eq")), rule.get("ref"))
