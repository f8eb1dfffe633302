"""``compare_table``: spreadsheets (.xlsx or .ods, either side) by cell values.

With no ``rules`` the two workbooks must have the same sheet names and the same values in every
cell of every sheet. The OSWorld rules this project implements are ``sheet_name``,
``sheet_data`` (optional ``precision``, ``ignore_case``) and ``check_cell`` on the ``value``
property; any other rule is reported by :func:`compare_table_unsupported`, so a task that needs
one is refused when its pool is loaded.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from dart.env.evaluators import table_rules as tr
from dart.env.evaluators.files import as_file
from dart.env.evaluators.metrics_basic import need_expected
from dart.env.evaluators.metrics_json import match_rule, method_supported
from dart.env.evaluators.registry import register_metric
from dart.env.evaluators.sheets import Sheet, UnreadableWorkbook, read_workbook
from dart.env.evaluators.table_rules import STYLE_PROPS
from dart.errors import ConfigError, EnvError

RULES = ("sheet_name", "sheet_data", "check_cell", "sheet_print", "sheet_fuzzy", "chart", "pivot_table", "style",
         "freeze", "zoom", "row_props", "data_validation")
_XLSX_RULES = ("sheet_fuzzy", "chart", "pivot_table", "style", "freeze", "zoom", "row_props", "data_validation")
"""Rules read from the .xlsx parts with openpyxl (not only cell values)."""
_COORD = re.compile(r"^([A-Z]{1,3})([1-9][0-9]*)$")


def compare_table_unsupported(options: Mapping[str, Any]) -> list[str]:
    """The parts of compare_table's options this implementation cannot score."""
    rules = options.get("rules", [])
    if not isinstance(rules, list):
        return ["rules (not a list)"]
    out = []
    for r in rules:
        kind = r.get("type") if isinstance(r, Mapping) else None
        if kind not in RULES:
            out.append(f"rule {kind}")
        elif kind == "check_cell":
            props = r.get("props", {})
            out += [f"check_cell prop {p}" for p in props if p != "value" and p not in STYLE_PROPS]
            method = (
                props.get("value", {}).get("method", "eq")
                if isinstance(props.get("value"), Mapping)
                else None
            )
            if method is not None and not method_supported(method):
                out.append(f"check_cell method {method}")
    unknown = set(options) - {"rules"}
    out += [f"option {k}" for k in sorted(unknown)]
    return out


def _workbook(value: Any, *, expected: bool) -> tuple[Sheet, ...] | None:
    f = as_file(value)
    if f is None:
        return None
    try:
        return read_workbook(f.data)
    except UnreadableWorkbook as exc:
        if expected:
            raise EnvError(f"compare_table: the expected workbook is unreadable: {exc}") from exc
        return None  # the agent saved something that is not a workbook: a plain failure


def _sheet(idx: Any, result: tuple[Sheet, ...], expected: tuple[Sheet, ...] | None) -> Sheet | None:
    """OSWorld sheet references: an int (result by index), 'RI0'/'EI0' (result/expected by
    index), 'RNname'/'ENname' (by name)."""
    if isinstance(idx, int):
        book, key, by_name = result, idx, False
    elif isinstance(idx, str) and len(idx) >= 2 and idx[0] in "RE" and idx[1] in "IN":
        book = result if idx[0] == "R" else expected
        by_name = idx[1] == "N"
        key = idx[2:] if by_name else int(idx[2:])
    else:
        raise ConfigError(f"compare_table: bad sheet reference {idx!r}")
    if book is None:
        raise EnvError("compare_table: a rule reads the expected workbook, which could not be fetched")
    if by_name:
        return next((s for s in book if s.name == key), None)
    return book[key] if 0 <= key < len(book) else None  # type: ignore[operator]


def _canon(rows: tuple[tuple[Any, ...], ...], *, precision: int | None, ignore_case: bool) -> list[list[Any]]:
    def cell(v: Any) -> Any:
        if isinstance(v, float) and precision is not None:
            return round(v, precision)
        if isinstance(v, str) and ignore_case:
            return v.lower()
        return v

    return [[cell(v) for v in row] for row in rows]


def _same_data(a: Sheet | None, b: Sheet | None, rule: Mapping[str, Any]) -> bool:
    if a is None or b is None:
        return False
    kw = {"precision": rule.get("precision"), "ignore_case": bool(rule.get("ignore_case"))}
    return _canon(a.rows, **kw) == _canon(b.rows, **kw)


def _cell_ok(sheet: Sheet | None, coordinate: str, props: Mapping[str, Any], ws: Any = None) -> bool:
    m = _COORD.match(str(coordinate))
    if m is None:
        raise ConfigError(f"compare_table: bad cell coordinate {coordinate!r}")
    col = 0
    for ch in m.group(1):
        col = col * 26 + ord(ch) - 64
    for prop, check in props.items():
        if prop == "value":
            value = None if sheet is None else sheet.cell(int(m.group(2)), col)
        elif ws is None:
            return False  # a style prop of a file that is not an .xlsx
        else:
            value = tr.cell_style(ws, str(coordinate), prop)
        if not match_rule(value, str(check.get("method", "eq")), check.get("ref")):
            return False
    return True


@register_metric("compare_table", check_options=compare_table_unsupported)
def compare_table(result: Any, expected: Any = None, **options: Any) -> float:
    """1 if the result workbook matches (all sheets' values, or every given rule), else 0."""
    rules = options.get("rules", [])
    if problems := compare_table_unsupported(options):
        raise ConfigError(
            f"compare_table cannot score {', '.join(problems)}; the pool check should refuse this task"
        )
    got = _workbook(result, expected=False)
    if got is None:
        return 0.0
    needs_expected = not rules or any(
        r["type"] in ("sheet_name", "sheet_print")
        or str(r.get("sheet_idx0", "")).startswith("E")
        or str(r.get("sheet_idx1", "")).startswith("E")
        for r in rules
    )
    want = _workbook(need_expected(expected, "compare_table"), expected=True) if needs_expected else None
    if not rules:
        same = [s.name for s in got] == [s.name for s in want or ()] and all(
            _same_data(a, b, {}) for a, b in zip(got, want or (), strict=False)
        )
        return 1.0 if same else 0.0
    got_wb = want_wb = None
    if any(r["type"] in _XLSX_RULES or (r["type"] == "check_cell" and set(r.get("props", {})) - {"value"})
           for r in rules):
        got_wb = tr.load_xlsx(as_file(result).data)
        if any(str(r.get("sheet_idx1", "")).startswith("E") for r in rules):
            want_wb = tr.load_xlsx(as_file(need_expected(expected, "compare_table")).data)
    for r in rules:
        if r["type"] in _XLSX_RULES:
            ok = _xlsx_rule(r, got_wb, want_wb)
        elif r["type"] == "sheet_print":
            ok = tr.sheet_print(
                _sheet(r.get("sheet_idx0", 0), got, want), _sheet(r.get("sheet_idx1", "EI0"), got, want), r
            )
        elif r["type"] == "sheet_name":
            ok = [s.name for s in got] == [s.name for s in want or ()]
        elif r["type"] == "sheet_data":
            ok = _same_data(
                _sheet(r.get("sheet_idx0", 0), got, want), _sheet(r.get("sheet_idx1", "EI0"), got, want), r
            )
        else:  # check_cell
            ws = tr.worksheet(got_wb, r.get("sheet_idx", 0), want_wb) if got_wb is not None else None
            ok = _cell_ok(
                _sheet(r.get("sheet_idx", 0), got, want), r.get("coordinate", ""), r.get("props", {}), ws
            )
        if not ok:
            return 0.0
    return 1.0


def _xlsx_rule(r: Mapping[str, Any], got_wb: Any, want_wb: Any) -> bool:
    if got_wb is None:
        return False  # the agent saved something that is not an .xlsx
    if r["type"] in ("zoom", "data_validation"):
        ws = tr.worksheet(got_wb, r.get("sheet_idx", 0), want_wb)
        return tr.zoom(ws, r, match_rule) if r["type"] == "zoom" else tr.data_validation(ws, r, match_rule)
    a = tr.worksheet(got_wb, r.get("sheet_idx0", 0), want_wb)
    b = tr.worksheet(got_wb, r.get("sheet_idx1", "EI0"), want_wb)
    check = {"sheet_fuzzy": tr.sheet_fuzzy, "chart": tr.charts, "pivot_table": tr.pivot_tables,
             "style": tr.styles, "freeze": tr.freeze, "row_props": tr.row_props}[r["type"]]
    return check(a, b, r)
