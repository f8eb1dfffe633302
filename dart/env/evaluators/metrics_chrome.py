"""Browser metrics (OSWorld's ``chrome`` metrics), pure functions of what the browser getters
return: tab lists ``[{"title", "url"}]``, a tab ``{"title", "url"}`` or a URL string, the
Bookmarks ``roots`` object, history rows ``(url, title, last_visit_time)``, cookie rows
``(host_key, name, path)``.
"""

from __future__ import annotations

import re
import urllib.parse
from collections.abc import Mapping
from typing import Any

from dart.env.evaluators.files import as_file
from dart.env.evaluators.metrics_basic import as_text, need_expected
from dart.env.evaluators.registry import register_metric


def _rules(expected: Any, metric: str) -> Mapping[str, Any]:
    rules = need_expected(expected, metric)
    return rules if isinstance(rules, Mapping) else {}


def normalize_url(url: str, *, query: bool = True) -> str:
    """A URL as OSWorld compares them: no scheme, no ``www.``, host lower-case, no trailing
    slash (and no query or fragment with ``query=False``)."""
    parts = urllib.parse.urlsplit(url.strip())
    if not parts.netloc and "://" not in url:  # "example.com/path"
        parts = urllib.parse.urlsplit("//" + url.strip())
    host = parts.netloc.lower().removeprefix("www.")
    out = host + parts.path.rstrip("/")
    if query:
        out += ("?" + parts.query if parts.query else "") + ("#" + parts.fragment if parts.fragment else "")
    return out


def _url(tab: Any) -> str | None:
    url = tab.get("url") if isinstance(tab, Mapping) else tab
    return url if isinstance(url, str) else None


@register_metric("is_expected_tabs")
def is_expected_tabs(result: Any, expected: Any = None, **options: Any) -> float:
    """The open tabs are ``rules.urls`` (as many, each one open; order aside, as in OSWorld)."""
    rules = _rules(expected, "is_expected_tabs")
    if not isinstance(result, list):
        return 0.0
    got = [normalize_url(u) for u in map(_url, result) if u is not None]
    want = [normalize_url(u) for u in rules.get("urls", [])]
    return float(len(got) == len(want) and all(w in got for w in want))


@register_metric("is_expected_active_tab")
def is_expected_active_tab(result: Any, expected: Any = None, **options: Any) -> float:
    """The active tab shows ``rules.url``."""
    url = _url(result)
    return float(url is not None and normalize_url(url) == normalize_url(_rules(expected, "is_expected_active_tab")["url"]))


@register_metric("is_expected_active_tab_approximate")
def is_expected_active_tab_approximate(result: Any, expected: Any = None, **options: Any) -> float:
    """The active tab shows ``rules.url``, query and fragment aside."""
    url = _url(result)
    want = _rules(expected, "is_expected_active_tab_approximate")["url"]
    return float(url is not None and normalize_url(url, query=False) == normalize_url(want, query=False))


@register_metric("is_expected_search_query")
def is_expected_search_query(result: Any, expected: Any = None, **options: Any) -> float:
    """The active tab's URL matches ``rules.expect.pattern``."""
    url = _url(result)
    pattern = _rules(expected, "is_expected_search_query").get("expect", {}).get("pattern", "")
    return float(url is not None and re.search(pattern, url) is not None)


def _children(node: Any) -> list[dict[str, Any]]:
    return [c for c in (node or {}).get("children", []) if isinstance(c, dict)]


@register_metric("is_expected_bookmarks")
def is_expected_bookmarks(result: Any, expected: Any = None, **options: Any) -> float:
    """Bookmarks bar checks: ``bookmark_bar_folders_names`` (its folders' names), 
    ``bookmark_bar_websites_urls`` (its links), ``liked_authors_websites_urls`` (the folder
    ``names[0]`` holds one link per author, each one of the author's ``urls``)."""
    rules = _rules(expected, "is_expected_bookmarks")
    if not isinstance(result, Mapping):
        return 0.0
    bar = _children(result.get("bookmark_bar"))
    kind = rules.get("type")
    if kind == "bookmark_bar_folders_names":
        return float({c.get("name") for c in bar if c.get("type") == "folder"} == set(rules.get("names", [])))
    if kind == "bookmark_bar_websites_urls":
        got = {normalize_url(c.get("url", "")) for c in bar if c.get("type") == "url"}
        return float(got == {normalize_url(u) for u in rules.get("urls", [])})
    if kind == "liked_authors_websites_urls":
        folder = next((c for c in bar if c.get("type") == "folder" and c.get("name") in rules.get("names", [])), None)
        links = [normalize_url(c.get("url", "")) for c in _children(folder) if c.get("type") == "url"]
        groups = [{normalize_url(u) for u in g} for g in rules.get("urls", [])]
        return float(folder is not None and len(links) == len(groups) and
                     all(any(link in g for link in links) for g in groups))
    return 0.0


@register_metric("is_cookie_deleted")
def is_cookie_deleted(result: Any, expected: Any = None, **options: Any) -> float:
    """No cookie of ``rules.domains`` is left."""
    rules = _rules(expected, "is_cookie_deleted")
    if not isinstance(result, list):
        return 0.0
    domains = {d.lstrip(".").lower() for d in rules.get("domains", [])}
    return float(not any(str(row[0]).lstrip(".").lower() in domains for row in result))


@register_metric("check_history_deleted")
def check_history_deleted(result: Any, expected: Any = None, **options: Any) -> float:
    """No history entry's URL holds one of ``rules.keywords``."""
    rules = _rules(expected, "check_history_deleted")
    if not isinstance(result, list):
        return 0.0
    return float(not any(k in str(row[0]) for row in result for k in rules.get("keywords", [])))


@register_metric("check_enabled_experiments")
def check_enabled_experiments(result: Any, expected: Any = None, **options: Any) -> float:
    """The enabled chrome://flags experiments are exactly ``rules.names``, in order."""
    if not isinstance(result, list):
        return 0.0
    return float([str(e).split("@")[0] for e in result] == list(_rules(expected, "check_enabled_experiments")["names"]))


@register_metric("check_font_size")
def check_font_size(result: Any, expected: Any = None, **options: Any) -> float:
    """The default font size is ``rules.value`` or strictly inside (``min``, ``max``)."""
    rules = _rules(expected, "check_font_size")
    size = result.get("default_font_size") if isinstance(result, Mapping) else None
    if not isinstance(size, int | float):
        return 0.0
    if rules.get("type") == "value":
        return float(size == rules.get("value"))
    return float(rules.get("min", 0) < size < rules.get("max", float("inf")))


@register_metric("is_expected_installed_extensions")
def is_expected_installed_extensions(result: Any, expected: Any = None, **options: Any) -> float:
    """Every extension of ``rules.expected`` is installed."""
    want = set(_rules(expected, "is_expected_installed_extensions").get("expected", []))
    return float(isinstance(result, list) and want <= set(result))


@register_metric("is_shortcut_on_desktop")
def is_shortcut_on_desktop(result: Any, expected: Any = None, **options: Any) -> float:
    """A desktop launcher runs ``rules.exec`` (``type: exec``) or is named ``rules.name``."""
    rules = _rules(expected, "is_shortcut_on_desktop")
    if not isinstance(result, Mapping):
        return 0.0
    if rules.get("type") == "exec":
        line = f"Exec={rules.get('exec')}"
        return float(any(line in str(text).splitlines() for text in result.values()))
    return float(any(f"Name={rules.get('name')}" in str(text).splitlines() for text in result.values()))


@register_metric("compare_htmls")
def compare_htmls(result: Any, expected: Any = None, **options: Any) -> float:
    """Both HTML files have the same elements (tag and stripped text), in document order."""
    import lxml.html

    a, b = as_text(result), as_text(as_file(need_expected(expected, "compare_htmls")))
    if a is None or b is None or not a.strip():
        return 0.0

    def walk(text: str) -> list[tuple[str, str]]:
        return [(str(e.tag), (e.text or "").strip()) for e in lxml.html.document_fromstring(text).iter()]

    try:
        return float(walk(a) == walk(b))
    except ValueError:  # lxml's ParserError
        return 0.0
