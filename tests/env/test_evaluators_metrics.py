"""Metrics on hand-made files: real .xlsx (openpyxl) and .ods (odfpy) workbooks, text, rules."""

from __future__ import annotations

import datetime as dt
import io
from pathlib import Path

import openpyxl
import pytest
from odf.opendocument import OpenDocumentSpreadsheet
from odf.table import Table, TableCell, TableRow
from odf.text import P

from dart.agent.actions import CallUser, Finished, Wait
from dart.env.evaluators import FileContent, get_metric
from dart.env.evaluators.metrics_table import compare_table_unsupported
from dart.env.evaluators.sheets import UnreadableWorkbook, read_workbook
from dart.errors import ConfigError, EnvError

TABLE = {
    "Sales": [["Week", "Revenue", "Cost"], [1, 100, 60.5], [2, 120, 70], [None, "total", 250.5]],
    "Notes": [["ok"]],
}


def xlsx(sheets: dict[str, list[list]]) -> FileContent:
    wb = openpyxl.Workbook()
    wb.remove(wb.active)
    for name, rows in sheets.items():
        ws = wb.create_sheet(name)
        for row in rows:
            ws.append(row)
    buf = io.BytesIO()
    wb.save(buf)
    return FileContent("/home/user/t.xlsx", buf.getvalue())


def ods(sheets: dict[str, list[list]], *, padding: bool = True) -> FileContent:
    """An .ods the way LibreOffice writes one: values typed, empty rows/cols repeated en masse."""
    doc = OpenDocumentSpreadsheet()
    for name, rows in sheets.items():
        table = Table(name=name)
        for row in rows:
            tr = TableRow()
            for v in row:
                if v is None:
                    tr.addElement(TableCell())
                    continue
                if isinstance(v, bool):
                    cell = TableCell(valuetype="boolean", booleanvalue=str(v).lower())
                elif isinstance(v, int | float):
                    cell = TableCell(valuetype="float", value=str(v))
                elif isinstance(v, dt.date):
                    cell = TableCell(valuetype="date", datevalue=v.isoformat())
                else:
                    cell = TableCell(valuetype="string")
                cell.addElement(P(text=str(v)))
                tr.addElement(cell)
            if padding:
                tr.addElement(TableCell(numbercolumnsrepeated=1020))
            table.addElement(tr)
        if padding:
            table.addElement(TableRow(numberrowsrepeated=1048000))
        doc.spreadsheet.addElement(table)
    buf = io.BytesIO()
    doc.write(buf)
    return FileContent("/home/user/t.ods", buf.getvalue())


def with_cell(sheets: dict, sheet: str, r: int, c: int, value) -> dict:
    out = {k: [list(row) for row in v] for k, v in sheets.items()}
    out[sheet][r][c] = value
    return out


compare_table = get_metric("compare_table")


def test_readers_agree_on_xlsx_and_ods_values():
    a, b = read_workbook(xlsx(TABLE).data), read_workbook(ods(TABLE).data)
    assert [s.name for s in a] == [s.name for s in b] == ["Sales", "Notes"]
    assert a[0].rows == b[0].rows
    assert b[0].cell(4, 3) == 250.5 and b[0].cell(4, 1) is None and b[0].cell(99, 99) is None


@pytest.mark.parametrize("fmt_result", [xlsx, ods])
@pytest.mark.parametrize("fmt_expected", [xlsx, ods])
def test_compare_table_without_rules_compares_every_sheet(fmt_result, fmt_expected):
    assert compare_table(fmt_result(TABLE), fmt_expected(TABLE)) == 1.0
    assert compare_table(fmt_result(with_cell(TABLE, "Sales", 2, 1, 121)), fmt_expected(TABLE)) == 0.0
    assert compare_table(fmt_result(with_cell(TABLE, "Notes", 0, 0, "OK")), fmt_expected(TABLE)) == 0.0
    renamed = {"Sales": TABLE["Sales"], "Other": TABLE["Notes"]}
    assert compare_table(fmt_result(renamed), fmt_expected(TABLE)) == 0.0
    assert compare_table(fmt_result({"Sales": TABLE["Sales"]}), fmt_expected(TABLE)) == 0.0


def test_compare_table_dates_and_booleans_match_across_formats():
    sheets = {"S": [[dt.datetime(2024, 3, 1), True, "x"]]}
    assert compare_table(ods(sheets), xlsx(sheets)) == 1.0


def test_compare_table_rules_sheet_data_with_precision_and_case():
    rule = {"type": "sheet_data", "sheet_idx0": "RNSales", "sheet_idx1": "EI0"}
    close = with_cell(TABLE, "Sales", 1, 2, 60.5001)
    assert compare_table(xlsx(close), ods(TABLE), rules=[rule]) == 0.0
    assert compare_table(xlsx(close), ods(TABLE), rules=[{**rule, "precision": 2}]) == 1.0
    shouty = with_cell(TABLE, "Sales", 0, 0, "WEEK")
    assert compare_table(xlsx(shouty), xlsx(TABLE), rules=[{**rule, "ignore_case": True}]) == 1.0
    # Only the first sheet is compared: a change in Notes does not matter to this rule.
    assert (
        compare_table(
            xlsx(with_cell(TABLE, "Notes", 0, 0, "no")), xlsx(TABLE), rules=[{**rule, "sheet_idx0": 0}]
        )
        == 1.0
    )
    assert compare_table(xlsx(TABLE), xlsx(TABLE), rules=[{"type": "sheet_name"}]) == 1.0
    assert compare_table(xlsx(TABLE), xlsx({"X": [[1]]}), rules=[{"type": "sheet_name"}]) == 0.0


def test_compare_table_check_cell_needs_no_expected_file():
    rules = [
        {
            "type": "check_cell",
            "sheet_idx": 0,
            "coordinate": "C4",
            "props": {"value": {"method": "approx:0.1", "ref": 250.45}},
        },
        {
            "type": "check_cell",
            "sheet_idx": "RNSales",
            "coordinate": "B1",
            "props": {"value": {"method": "eq", "ref": "Revenue"}},
        },
    ]
    assert compare_table(ods(TABLE), None, rules=rules) == 1.0
    rules[0]["props"]["value"]["ref"] = 251
    assert compare_table(ods(TABLE), None, rules=rules) == 0.0


def test_compare_table_result_missing_or_corrupt_scores_zero_but_bad_gold_is_an_env_error():
    assert compare_table(None, xlsx(TABLE)) == 0.0
    assert compare_table(FileContent("/r.xlsx", b"not a zip"), xlsx(TABLE)) == 0.0
    with pytest.raises(EnvError, match="expected workbook"):
        compare_table(xlsx(TABLE), FileContent("/g.xlsx", b"garbage"))
    with pytest.raises(EnvError, match="could not be fetched"):
        compare_table(xlsx(TABLE), None)
    with pytest.raises(UnreadableWorkbook):
        read_workbook(b"PK\x03\x04 truncated")


def test_compare_table_reports_rules_it_cannot_score():
    opts = {
        "rules": [
            {"type": "sheet_data"},
            {"type": "sparkline"},
            {"type": "check_cell", "props": {"font_shadow": {}}},
        ]
    }
    assert compare_table_unsupported(opts) == ["rule sparkline", "check_cell prop font_shadow"]
    assert compare_table_unsupported({"rules": [{"type": "sheet_name"}]}) == []
    with pytest.raises(ConfigError, match="rule sparkline"):
        compare_table(xlsx(TABLE), xlsx(TABLE), **opts)


def test_compare_table_accepts_bytes_and_local_paths(tmp_path: Path):
    p = tmp_path / "r.xlsx"
    p.write_bytes(xlsx(TABLE).data)
    assert compare_table(p, xlsx(TABLE).data) == 1.0
    assert compare_table(tmp_path / "absent.xlsx", xlsx(TABLE)) == 0.0


def test_compare_text_file_options():
    m = get_metric("compare_text_file")
    gold = FileContent("/g.txt", b"Hello  World\nline two\n")
    assert m(FileContent("/r.txt", b"Hello  World\nline two\n"), gold) == 1.0
    assert m(FileContent("/r.txt", b"Hello World line two"), gold) == 0.0
    assert m(FileContent("/r.txt", b"Hello World line two"), gold, ignore_blanks=True) == 1.0
    assert (
        m(FileContent("/r.txt", b"hello world\nLINE TWO\n"), gold, ignore_blanks=True, ignore_case=True)
        == 1.0
    )
    assert m(None, gold) == 0.0
    with pytest.raises(EnvError):
        m(FileContent("/r.txt", b"x"), None)


def test_compare_csv_lines_and_several_gold_files():
    m = get_metric("compare_csv")
    gold = [FileContent("/a.csv", b"a,b\n1,2\n"), FileContent("/b.csv", b"a,b\n1,3\n")]
    assert m(FileContent("/r.csv", b"a,b\n1,3"), gold) == 1.0
    assert m(FileContent("/r.csv", b"a,b\n1,4"), gold) == 0.0
    assert m(FileContent("/r.csv", b"a,b \n1,2"), gold[0]) == 0.0
    assert m(FileContent("/r.csv", b"a,b \n1,2"), gold[0], strict=False) == 1.0


def test_exact_match_and_include_exclude():
    em = get_metric("exact_match")
    assert em("true", {"expected": "true"}) == 1.0
    assert em("true\n", {"expected": "true"}) == 0.0
    assert em(None, {"expected": "true"}) == 0.0
    ie = get_metric("check_include_exclude")
    rules = {"include": ["filters-vignette"], "exclude": ["error", "failed"]}
    assert ie("a\nfilters-vignette\n", rules) == 1.0
    assert ie("filters-vignette failed", rules) == 0.0
    assert ie("nothing", rules) == 0.0
    assert ie(None, rules) == 0.0
    assert ie(FileContent("/h", b"filters-vignette"), rules) == 1.0


@pytest.mark.parametrize(
    ("final", "score"), [(CallUser(), 1.0), (None, 0.0), (Finished(content="done"), 0.0), (Wait(), 0.0)]
)
def test_infeasible_scores_only_the_agents_own_call_user(final, score):
    assert get_metric("infeasible")(final, None) == score
