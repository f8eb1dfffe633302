"""Office metrics on files built here with python-pptx, python-docx and matplotlib's PDF writer:
each scores 1 on a match and 0 on the difference its options examine."""

from __future__ import annotations

import io

import pytest

from dart.env.evaluators import FileContent, get_metric
from dart.errors import EnvError


def pptx(texts: list[str], *, bold: bool = False, left_in: float = 1.0, notes: str = "") -> FileContent:
    from pptx import Presentation
    from pptx.util import Inches

    prs = Presentation()
    for text in texts:
        slide = prs.slides.add_slide(prs.slide_layouts[6])
        box = slide.shapes.add_textbox(Inches(left_in), Inches(1), Inches(4), Inches(1))
        run = box.text_frame.paragraphs[0].add_run()
        run.text = text
        run.font.bold = bold
        if notes:
            slide.notes_slide.notes_text_frame.text = notes
    buf = io.BytesIO()
    prs.save(buf)
    return FileContent("/home/user/deck.pptx", buf.getvalue())


def docx(paras: list[str], *, table: list[list[str]] | None = None, spacing: float | None = None) -> FileContent:
    import docx as python_docx

    doc = python_docx.Document()
    for p in paras:
        par = doc.add_paragraph(p)
        if spacing is not None:
            par.paragraph_format.line_spacing = spacing
    if table:
        t = doc.add_table(rows=len(table), cols=len(table[0]))
        for i, row in enumerate(table):
            for j, v in enumerate(row):
                t.cell(i, j).text = v
    buf = io.BytesIO()
    doc.save(buf)
    return FileContent("/home/user/doc.docx", buf.getvalue())


def pdf(text: str) -> FileContent:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with matplotlib.rc_context({"pdf.fonttype": 42}):  # TrueType: text a PDF reader can extract
        fig = plt.figure()
        fig.text(0.1, 0.5, text)
        buf = io.BytesIO()
        fig.savefig(buf, format="pdf")
        plt.close(fig)
    return FileContent("/home/user/out.pdf", buf.getvalue())


def test_compare_pptx_files_matches_equal_decks_and_catches_text_bold_position_count_and_notes():
    m = get_metric("compare_pptx_files")
    gold = pptx(["Title", "Body"], notes="n")
    assert m(pptx(["Title", "Body"], notes="n"), gold) == 1.0
    assert m(pptx(["Title", "Bodx"], notes="n"), gold) == 0.0
    assert m(pptx(["Title", "Body"], bold=True, notes="n"), gold) == 0.0
    assert m(pptx(["Title", "Body"], bold=True, notes="n"), gold, examine_font_bold=False) == 1.0
    assert m(pptx(["Title", "Body"], left_in=2, notes="n"), gold) == 0.0
    assert m(pptx(["Title", "Body"], left_in=2, notes="n"), gold, examine_shape=False) == 1.0
    assert m(pptx(["Title"], notes="n"), gold) == 0.0
    assert m(pptx(["Title", "Body"], notes="other"), gold) == 0.0
    assert m(None, gold) == 0.0
    assert m(FileContent("x.pptx", b"not a zip"), gold) == 0.0
    with pytest.raises(EnvError):
        m(gold, FileContent("gold.pptx", b"broken"))


def test_compare_docx_files_options_follow_osworld():
    m = get_metric("compare_docx_files")
    gold = docx(["Hello  world", "Second line"])
    assert m(docx(["Hello world", "Second line"]), gold) == 1.0  # blanks squashed by default
    assert m(docx(["Hello world", "Second line"]), gold, ignore_blanks=False) == 0.0
    assert m(docx(["Second line", "Hello  world"]), gold, ignore_blanks=False, ignore_order=True) == 1.0
    assert m(docx(["hello world", "second line"]), gold, ignore_case=True) == 1.0
    assert 0.8 < m(docx(["Hello world", "Second lime"]), gold, content_only=True) < 1.0
    assert m(docx(["Hello world", "", "Second line"]), gold, ignore_blanks=False, delete_empty_lines=True) == 0.0
    assert m(None, gold) == 0.0


def test_compare_docx_tables_and_line_spacing():
    tables = get_metric("compare_docx_tables")
    gold = docx(["x"], table=[["a", "b"], ["1", "2"]])
    assert tables(docx(["x"], table=[["a", "b"], ["1", "2"]]), gold) == 1.0
    assert tables(docx(["x"], table=[["a", "b"], ["1", "3"]]), gold) == 0.0
    spacing = get_metric("compare_line_spacing")
    assert spacing(docx(["p", "q"], spacing=2.0), docx(["p", "q"], spacing=2.0)) == 1.0
    assert spacing(docx(["p", "q"], spacing=1.0), docx(["p", "q"], spacing=2.0)) == 0.0


def test_compare_pdfs_is_the_fuzzy_ratio_of_the_texts():
    m = get_metric("compare_pdfs")
    gold = pdf("Quarterly report 2024")
    assert m(pdf("Quarterly report 2024"), gold) == 1.0
    assert 0.5 < m(pdf("Quarterly report 2023"), gold) < 1.0
    assert m(None, gold) == 0.0
    assert get_metric("check_pdf_pages")(gold, {"expected": 1}) == 1.0


def test_check_direct_json_object_exact_and_expect_in_result():
    m = get_metric("check_direct_json_object")
    assert m('{"a": "1", "b": true}', {"expected": {"a": "1"}}) == 1.0
    assert m({"a": "2"}, {"expected": {"a": "1"}}) == 0.0
    assert m({"a": "Zurich HB", "b": ["x", "y"]}, {"expected": {"a": "Zurich", "b": ["y"]},
                                                  "expect_in_result": True}) == 1.0
    assert m(None, {"expected": {"a": "1"}}) == 0.0


def test_settings_file_checks():
    prefs = FileContent("prefs.js", b'user_pref("mail.identity.id1.auto_quote", false);\n'
                                    b'user_pref("extensions.activeThemeID", "thunderbird-compact-dark@mozilla.org");\n')
    tb = get_metric("check_thunderbird_prefs")
    assert tb(prefs, {"expect": {"mail.identity.id1.auto_quote": {"method": "eq", "ref": False}}}) == 1.0
    assert tb(prefs, {"expect": {"extensions.activeThemeID": {"method": "re", "ref": "dark"}}}) == 1.0
    assert tb(prefs, {"expect": {"missing.pref": {"method": "eq", "ref": 1}}}) == 0.0
    filters = FileContent("msgFilterRules.dat", b'version="9"\nname="promo"\nenabled="yes"\ntype="17"\n'
                          b'action="Move to folder"\nactionValue="mailbox://nobody@Local%20Folders/Promotions"\n'
                          b'condition="AND (subject,contains,discount)"\n')
    want = {"enabled": "yes", "action": "Move to folder", "condition": ["AND (subject,contains,discount)"]}
    assert get_metric("check_thunderbird_filter")(filters, {"expect": [want]}) == 1.0
    gimprc = FileContent("gimprc", b'# gimprc\n(theme "Light")\n(undo-levels 100)\n')
    assert get_metric("check_config_status")(gimprc, {"key": "theme", "value": '"Light"'}) == 1.0
    assert get_metric("check_config_status")(gimprc, {"key": "undo-levels", "value": "5"}) == 0.0
    assert get_metric("check_list")(FileContent("o", b"foo.msf\nbar\n"), {"expect": [r"\bfoo\.msf\b"],
                                                                         "unexpect": ["baz"]}) == 1.0
    kb = FileContent("keybindings.json", b'// keys\n[{"key": "ctrl+j", "command": "x"}]')
    assert get_metric("check_json_keybindings")(kb, {"expected": {"key": "ctrl+j", "command": "x"}}) == 1.0


def xlsx(values: list[list], *, bold_a1: bool = False, freeze: str | None = None, chart_title: str | None = None,
         zoom: int | None = None, dv: str | None = None) -> FileContent:
    import openpyxl
    from openpyxl.chart import BarChart, Reference
    from openpyxl.styles import Font
    from openpyxl.worksheet.datavalidation import DataValidation

    wb = openpyxl.Workbook()
    ws = wb.active
    for row in values:
        ws.append(row)
    ws["A1"].font = Font(bold=bold_a1)
    ws.freeze_panes = freeze
    if zoom:
        ws.sheet_view.zoomScale = zoom
    if chart_title is not None:
        chart = BarChart()
        chart.title = chart_title
        chart.add_data(Reference(ws, min_col=2, min_row=1, max_row=len(values)), titles_from_data=True)
        ws.add_chart(chart, "D2")
    if dv:
        v = DataValidation(type="list", formula1=dv)
        v.add("D2:D29")
        ws.add_data_validation(v)
    buf = io.BytesIO()
    wb.save(buf)
    return FileContent("/home/user/book.xlsx", buf.getvalue())


def test_compare_table_rules_beyond_values():
    m = get_metric("compare_table")
    rows = [["name", "n"], ["a", 1], ["b", 2.0]]
    gold = xlsx(rows, freeze="A2", chart_title="Sales")

    def rule(**r):
        return {"rules": [{"sheet_idx0": 0, "sheet_idx1": "EI0", **r}]}

    assert m(xlsx([["Name", "n"], ["a", 1.0], ["b", 2]]), gold, **rule(type="sheet_print", ignore_case=True)) == 1.0
    assert m(xlsx([["Name", "n"], ["a", 1.0], ["b", 3]]), gold, **rule(type="sheet_print", ignore_case=True)) == 0.0
    assert m(xlsx(rows, freeze="A2"), gold, **rule(type="freeze")) == 1.0
    assert m(xlsx(rows), gold, **rule(type="freeze")) == 0.0
    assert m(xlsx(rows, chart_title="Sales"), gold, **rule(type="chart", chart_props=["type", "title"])) == 1.0
    assert m(xlsx(rows, chart_title="Cost"), gold, **rule(type="chart", chart_props=["type", "title"])) == 0.0
    fuzzy = rule(type="sheet_fuzzy", rules=[{"range": ["A1:A3"], "type": "fuzzy_match", "threshold": 80}])
    assert m(xlsx([["names", "n"], ["a", 1], ["b", 2]]), gold, **fuzzy) == 1.0
    bold = {"rules": [{"type": "check_cell", "sheet_idx": 0, "coordinate": "A1",
                       "props": {"font_bold": {"method": "eq", "ref": True}}}]}
    assert m(xlsx(rows, bold_a1=True), None, **bold) == 1.0
    assert m(xlsx(rows), None, **bold) == 0.0
    assert m(xlsx(rows, zoom=200), None, rules=[{"type": "zoom", "sheet_idx": 0, "method": "lt", "ref": 260}]) == 1.0
    dv = {"rules": [{"type": "data_validation", "sheet_idx": 0, "dv_props": [
        {"ranges": {"method": "spreadsheet_range", "ref": ["D2:D29"]}, "type": {"method": "eq", "ref": "list"},
         "formula1": {"method": "str_set_eq", "ref": ["Pass", "Fail"]}}]}]}
    assert m(xlsx(rows, dv='"Pass,Fail"'), None, **dv) == 1.0
    assert m(xlsx(rows), None, **dv) == 0.0


def test_single_task_writer_and_impress_checks():
    import docx as python_docx
    from docx.enum.text import WD_BREAK

    d = python_docx.Document()
    d.add_paragraph("Title").alignment = 1
    d.add_paragraph("one").add_run().add_break(WD_BREAK.PAGE)
    buf = io.BytesIO()
    d.save(buf)
    f = FileContent("d.docx", buf.getvalue())
    assert get_metric("is_first_line_centered")(f) == 1.0
    assert get_metric("is_first_line_centered")(docx(["Title"])) == 0.0
    assert get_metric("contains_page_break")(f, {"page_break_count": 1}) == 1.0
    assert get_metric("contains_page_break")(docx(["x"]), {"page_break_count": 1}) == 0.0
    assert get_metric("check_slide_orientation_Portrait")(pptx(["a"])) == 0.0  # python-pptx decks are landscape
    xcu = FileContent("registrymodifications.xcu", b'<?xml version="1.0"?><oor:items '
                      b'xmlns:oor="http://openoffice.org/2001/registry"><item oor:path="/org.openoffice.Office.'
                      b'Recovery/AutoSave"><prop oor:name="TimeIntervall" oor:op="fuse"><value>3</value></prop>'
                      b"</item></oor:items>")
    assert get_metric("check_auto_saving_time")(xcu, {"minutes": 3}) == 1.0
    assert get_metric("check_auto_saving_time")(xcu, {"minutes": 10}) == 0.0
