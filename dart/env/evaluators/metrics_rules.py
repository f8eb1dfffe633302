"""Rule checks over text, JSON, lists and settings files (OSWorld's ``general``, ``thunderbird``,
``gimp``, ``vscode`` and ``basic_os`` metrics), pure functions of the getters' values.

``expected`` is the task's rules object (the ``rule`` getter); a result that is missing or
unreadable scores 0.
"""

from __future__ import annotations

import ast
import csv
import difflib
import io
import json
import re
import sqlite3
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from dart.env.evaluators.files import as_file
from dart.env.evaluators.metrics_basic import as_text, need_expected
from dart.env.evaluators.metrics_json import match_rule
from dart.env.evaluators.registry import register_metric


def _rules(expected: Any, metric: str) -> Mapping[str, Any]:
    rules = need_expected(expected, metric)
    return rules if isinstance(rules, Mapping) else {"expected": rules}


def _json(value: Any) -> Any:
    """A getter's value as a JSON object: dicts as they are, text parsed (OSWorld also accepts
    single quotes), anything unreadable None."""
    if value is None or isinstance(value, dict | list):
        return value
    text = as_text(value)
    if text is None:
        return None
    for candidate in (text.strip(), text.strip().replace("'", '"')):
        try:
            return json.loads(candidate)
        except ValueError:
            continue
    return None


@register_metric("check_direct_json_object")
def check_direct_json_object(result: Any, expected: Any = None, **options: Any) -> float:
    """Every key of ``rules.expected`` has that value in the result object; with
    ``expect_in_result`` a string must occur in the result's value and a list must share an
    item with it."""
    rules = _rules(expected, "check_direct_json_object")
    got = _json(result)
    want = rules.get("expected", {})
    if not isinstance(got, dict) or not isinstance(want, dict):
        return 0.0
    if not rules.get("expect_in_result", False):
        return float(all(got.get(k) == v for k, v in want.items()))
    for key, v in want.items():
        have = got.get(key)
        if isinstance(v, list):
            if not (isinstance(have, list) and any(item in have for item in v)):
                return 0.0
        elif isinstance(v, str):
            if not isinstance(have, str) or v not in have:
                return 0.0
        else:
            return 0.0
    return 1.0


def _lines(value: Any) -> list[str] | None:
    text = as_text(value)
    return None if text is None else text.splitlines()


@register_metric("check_list")
def check_list(result: Any, expected: Any = None, **options: Any) -> float:
    """Each ``expect`` pattern matches some line of the result; no ``unexpect`` pattern does."""
    rules = _rules(expected, "check_list")
    lines = _lines(result)
    if lines is None:
        return 0.0
    ok = all(any(re.search(p, line) for line in lines) for p in rules.get("expect", []))
    bad = any(re.search(p, line) for p in rules.get("unexpect", []) for line in lines)
    return float(ok and not bad)


@register_metric("is_expected_url_pattern_match")
def is_expected_url_pattern_match(result: Any, expected: Any = None, **options: Any) -> float:
    """Every pattern of ``rules.expected`` is found (re.search) in the URL (a string, or a tab's ``url``)."""
    rules = _rules(expected, "is_expected_url_pattern_match")
    url = result.get("url") if isinstance(result, Mapping) else result
    if not isinstance(url, str):
        return 0.0
    return float(all(re.search(p, url) for p in rules.get("expected", [])))


@register_metric("is_in_list")
def is_in_list(result: Any, expected: Any = None, **options: Any) -> float:
    """``rules.expected`` is one of the result's items."""
    want = _rules(expected, "is_in_list").get("expected")
    return float(isinstance(result, list | tuple | str) and want in result)


@register_metric("match_in_list")
def match_in_list(result: Any, expected: Any = None, **options: Any) -> float:
    """The result is one of ``rules.expected``."""
    return float(result is not None and result in _rules(expected, "match_in_list").get("expected", []))


@register_metric("literal_match")
def literal_match(result: Any, expected: Any = None, **options: Any) -> float:
    """The result equals the expected value (``type: list`` compares item by item as text;
    ``ignore_case`` lower-cases strings)."""
    want = need_expected(expected, "literal_match")
    if result is None:
        return 0.0
    if options.get("type", "str") == "list" or isinstance(result, list):
        if not isinstance(result, list) or not isinstance(want, list):
            return 0.0
        return float([str(a) for a in result] == [str(b) for b in want])
    a, b = str(result), str(want)
    if options.get("ignore_case", False):
        a, b = a.lower(), b.lower()
    return float(a == b)


@register_metric("check_csv")
def check_csv(result: Any, expected: Any = None, **options: Any) -> float:
    """Each ``expect`` row (a dict of columns) matches some CSV row; no ``unexpect`` row does."""
    rules = _rules(expected, "check_csv")
    text = as_text(result)
    if text is None:
        return 0.0
    rows = list(csv.DictReader(io.StringIO(text)))

    def found(want: Mapping[str, Any]) -> bool:
        return any(all(row.get(k) == str(v) for k, v in want.items()) for row in rows)

    return float(all(found(w) for w in rules.get("expect", [])) and
                 not any(found(w) for w in rules.get("unexpect", [])))


@register_metric("diff_text_file")
def diff_text_file(result: Any, expected: Any = None, **options: Any) -> float:
    """difflib's similarity ratio of the two texts."""
    a, b = as_text(result), as_text(need_expected(expected, "diff_text_file"))
    if a is None or b is None:
        return 0.0
    return difflib.SequenceMatcher(None, a, b).ratio()


@register_metric("compare_config")
def compare_config(result: Any, expected: Any = None, **options: Any) -> float:
    """The file's text equals ``rules.expected`` exactly."""
    text = as_text(result)
    return float(text is not None and text == _rules(expected, "compare_config").get("expected"))


def _strip_json_comments(text: str) -> str:
    return re.sub(r"^\s*//.*$", "", text, flags=re.MULTILINE)


@register_metric("check_json_keybindings")
def check_json_keybindings(result: Any, expected: Any = None, **options: Any) -> float:
    """VS Code keybindings.json (comments allowed) holds the binding ``rules.expected``."""
    want = _rules(expected, "check_json_keybindings").get("expected")
    text = as_text(result)
    if text is None:
        return 0.0
    try:
        data = json.loads(_strip_json_comments(text))
    except ValueError:
        return 0.0
    return float(isinstance(data, list) and want in data)


_PREF = re.compile(r'^\s*user_pref\("([^"]+)",\s*(.+)\);\s*$')


def _prefs(text: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for line in text.splitlines():
        m = _PREF.match(line)
        if m:
            try:
                out[m.group(1)] = json.loads(m.group(2))
            except ValueError:
                out[m.group(1)] = m.group(2)
    return out


def _pref_matches(value: Any, rule: Mapping[str, Any]) -> bool:
    method = str(rule.get("method", "eq"))
    if method.startswith("re"):  # "re" or "re.S"
        flags = re.S if method == "re.S" else 0
        return isinstance(value, str) and re.search(str(rule.get("ref")), value, flags) is not None
    return match_rule(value, method, rule.get("ref"))


@register_metric("check_thunderbird_prefs")
def check_thunderbird_prefs(result: Any, expected: Any = None, **options: Any) -> float:
    """prefs.js: every ``expect`` pref is set and matches its rule; no ``unexpect`` pref matches."""
    rules = _rules(expected, "check_thunderbird_prefs")
    text = as_text(result)
    if text is None:
        return 0.0
    prefs = _prefs(text)
    ok = all(k in prefs and _pref_matches(prefs[k], r) for k, r in rules.get("expect", {}).items())
    bad = any(k in prefs and _pref_matches(prefs[k], r) for k, r in rules.get("unexpect", {}).items())
    return float(ok and not bad)


def _filters(text: str) -> list[dict[str, Any]]:
    filters: list[dict[str, Any]] = []
    for line in text.splitlines():
        m = re.match(r'^(\w+)="(.*)"$', line.strip())
        if not m:
            continue
        key, value = m.groups()
        if key == "name":
            filters.append({"name": value})
        elif filters:
            filters[-1][key] = re.findall(r"(?:AND|OR) \(.+?\)|ALL", value) if key == "condition" else value
    return filters


@register_metric("check_thunderbird_filter")
def check_thunderbird_filter(result: Any, expected: Any = None, **options: Any) -> float:
    """msgFilterRules.dat: every ``expect`` filter (its listed fields) is among the filters;
    no ``unexpect`` filter is."""
    rules = _rules(expected, "check_thunderbird_filter")
    text = as_text(result)
    if text is None:
        return 0.0
    filters = _filters(text)

    def found(want: Mapping[str, Any]) -> bool:
        return any(all(f.get(k) == v for k, v in want.items()) for f in filters)

    return float(all(found(w) for w in rules.get("expect", [])) and
                 not any(found(w) for w in rules.get("unexpect", [])))


@register_metric("check_config_status")
def check_config_status(result: Any, expected: Any = None, **options: Any) -> float:
    """A GIMP-style ``(key value)`` line sets ``rules.key`` to ``rules.value``."""
    rules = _rules(expected, "check_config_status")
    lines = _lines(result)
    if lines is None:
        return 0.0
    for line in lines:
        if line.lstrip().startswith("#"):
            continue
        items = line.strip().lstrip("(").rstrip(")").split()
        if len(items) >= 2 and items[0] == rules.get("key") and items[-1] == rules.get("value"):
            return 1.0
    return 0.0


@register_metric("is_in_vm_clickboard")
def is_in_vm_clickboard(result: Any, expected: Any = None, **options: Any) -> float:
    """The clipboard text (OSWorld passes it as ``expected``) holds ``rules.expected`` (all of a list)."""
    want = _rules(result, "is_in_vm_clickboard").get("expected")
    clip = as_text(expected) or ""
    return float(all(w in clip for w in want) if isinstance(want, list) else (want in clip))


@register_metric("check_line_number")
def check_line_number(result: Any, expected: Any = None, **options: Any) -> float:
    """The file has ``rules.expected`` lines stamped with a time of day (sar-style reports)."""
    lines = _lines(result)
    if lines is None:
        return 0.0
    stamped = sum(1 for line in lines if re.search(r"\d{2}:\d{2}:\d{2}", line))
    return float(stamped == int(_rules(expected, "check_line_number").get("expected", -1)))


@register_metric("is_utc_0")
def is_utc_0(result: Any, expected: Any = None, **options: Any) -> float:
    """timedatectl reports a time zone at UTC+0."""
    text = as_text(result) or ""
    zone = next((line for line in text.splitlines() if "Time zone" in line), "")
    return float("+0000" in zone)


@register_metric("check_gnome_favorite_apps")
def check_gnome_favorite_apps(result: Any, expected: Any = None, **options: Any) -> float:
    """gsettings' favourite-apps list equals ``rules.expected`` as a set."""
    try:
        apps = ast.literal_eval((as_text(result) or "").strip())
    except (ValueError, SyntaxError):
        return 0.0
    want = _rules(expected, "check_gnome_favorite_apps").get("expected", [])
    return float(isinstance(apps, list) and len(apps) == len(want) and set(apps) == set(want))


@register_metric("run_sqlite3")
def run_sqlite3(result: Any, expected: Any = None, **options: Any) -> float:
    """The first value of ``rules.sql`` run on the result database (as a score)."""
    f = as_file(result)
    if f is None:
        return 0.0
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "db.sqlite"
        db.write_bytes(f.data)
        conn = sqlite3.connect(db)
        try:
            row = conn.execute(_rules(expected, "run_sqlite3")["sql"]).fetchone()
        except sqlite3.Error:
            return 0.0
        finally:
            conn.close()
    return float(row[0] or 0) if row else 0.0


@register_metric("check_moved_jpgs")
def check_moved_jpgs(result: Any, expected: Any = None, **options: Any) -> float:
    """The folder holds exactly the ``rules.expected`` file names."""
    want = _rules(expected, "check_moved_jpgs").get("expected", [])
    return float(isinstance(result, list) and sorted(result) == sorted(want))


def _code_lines(text: str) -> list[str]:
    return [line.rstrip() for line in text.splitlines() if line.strip()]


@register_metric("compare_python_pure_text")
def compare_python_pure_text(result: Any, expected: Any = None, **options: Any) -> float:
    """The two sources are equal once blank lines and trailing spaces are dropped."""
    a, b = as_text(result), as_text(need_expected(expected, "compare_python_pure_text"))
    return float(a is not None and b is not None and _code_lines(a) == _code_lines(b))


@register_metric("compare_result_files")
def compare_result_files(result: Any, expected: Any = None, **options: Any) -> float:
    """The files hold the same number (to 1e-6), or else the same stripped text."""
    a, b = as_text(result), as_text(need_expected(expected, "compare_result_files"))
    if a is None or b is None:
        return 0.0
    try:
        return float(abs(float(a.strip()) - float(b.strip())) < 1e-6)
    except ValueError:
        return float(a.strip() == b.strip())
