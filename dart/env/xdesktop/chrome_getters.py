"""OSWorld's browser getters on the slot's Chromium: tabs and page contents through the DevTools
protocol, settings and stores from the profile's files (Preferences, Local State, Bookmarks,
History and Cookies sqlite).

Differences from OSWorld, on purpose: ``active_url_from_accessTree`` reads the active tab's URL
from DevTools rather than the URL bar's accessible text, so ``goto_prefix`` (which restores what
the URL bar hides) is not needed; the sqlite stores are copied before reading, since the
running browser holds their locks.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
import tempfile
import urllib.parse
from pathlib import Path
from typing import Any

from dart.env.xdesktop.chrome import Chrome
from dart.env.xdesktop.getter_table import GetterTable
from dart.errors import EnvError

getter = GetterTable("browser")
"""``@getter("name")`` defines a getter; ``register_all`` hands them to the evaluator registry."""


def _chrome(ctx: Any) -> Chrome:
    chrome = ctx.extras.get("chrome")
    if chrome is None:
        raise EnvError("this backend has no browser handle for browser getters")
    return chrome


async def _active(ctx: Any) -> dict[str, Any] | None:
    return await _chrome(ctx).active_page()


@getter("open_tabs_info")
async def open_tabs_info(env: Any, params: dict[str, Any], ctx: Any) -> list[dict[str, str]]:
    return [{"title": p.get("title", ""), "url": p.get("url", "")} for p in await _chrome(ctx).pages()]


@getter("active_tab_info")
async def active_tab_info(env: Any, params: dict[str, Any], ctx: Any) -> dict[str, str] | None:
    page = await _active(ctx)
    return None if page is None else {"title": page.get("title", ""), "url": page.get("url", "")}


@getter("active_url_from_accessTree")
async def active_url(env: Any, params: dict[str, Any], ctx: Any) -> str | None:
    page = await _active(ctx)
    return None if page is None else page.get("url")


@getter("active_tab_url_parse")
async def active_tab_url_parse(env: Any, params: dict[str, Any], ctx: Any) -> dict[str, Any] | None:
    """The active URL's query values for ``parse_keys`` (``replace`` renames keys)."""
    url = await active_url(env, params, ctx)
    if url is None:
        return None
    query = urllib.parse.parse_qs(urllib.parse.urlsplit(url).query)
    out = {k: query[k][0] for k in params.get("parse_keys", []) if k in query}
    for old, new in (params.get("replace") or {}).items():
        if old in out:
            out[new] = out.pop(old)
    return out


@getter("url_dashPart")
async def url_dash_part(env: Any, params: dict[str, Any], ctx: Any) -> Any:
    """One ``/``-separated part of the active URL (``partIndex``), as ``{key: part}`` for
    ``returnType: json``; ``needDeleteId`` drops a trailing ``?id`` query."""
    url = await active_url(env, params, ctx)
    if url is None:
        return None
    if params.get("needDeleteId"):
        url = url.split("?", 1)[0]
    parts = url.rstrip("/").split("/")
    try:
        part = parts[int(params.get("partIndex", -1))]
    except IndexError:
        return None
    return {params.get("key", "part"): part} if params.get("returnType") == "json" else part


_DOM_JS = """(() => { const q = %s; const out = {};
  const txt = e => (e.innerText || e.textContent || '').trim();
  for (const c of q.classes) { out['c:' + c] = Array.from(document.getElementsByClassName(c)).map(e => ({
      text: txt(e), children: Array.from(e.children).map(txt), li: Array.from(e.querySelectorAll('li')).map(txt)})); }
  for (const x of q.xpaths) { const n = document.evaluate(x, document, null, 9, null).singleNodeValue;
      out['x:' + x] = n ? {text: txt(n), value: n.value === undefined ? null : n.value} : null; }
  return out; })()"""


def _pick(items: list[str], idx: Any) -> str:
    i = int(idx)
    return items[i] if -len(items) <= i < len(items) else ""


def html_fields(params: dict[str, Any], dom: dict[str, Any], url: str) -> dict[str, Any]:
    """What ``active_tab_html_parse`` returns, from the DOM extract of :data:`_DOM_JS` (pure)."""
    out: dict[str, Any] = {}

    def els(cls: str) -> list[dict[str, Any]]:
        return dom.get("c:" + cls) or []

    for cls, key in (params.get("class_singleObject") or {}).items():
        out[key] = els(cls)[0]["text"] if els(cls) else ""
    search = {cls: (list(w), "text") for cls, w in (params.get("class_multiObject_search_exist") or {}).items()}
    for cls, keys in (params.get("class_multiObject") or {}).items():
        if isinstance(keys, list):  # "class&url": which of these texts the elements show
            search[cls] = ([*keys, "is_other_exist"], "text")
        else:
            out.update({k: _pick([e["text"] for e in els(cls)], i) for i, k in keys.items()})
    for cls, keys in (params.get("class_multiObject_child") or {}).items():
        out.update({k: _pick(els(cls)[0]["children"] if els(cls) else [], i) for i, k in keys.items()})
    for cls, keys in (params.get("class_multiObject_only_child") or {}).items():
        firsts = [e["children"][0] if e["children"] else e["text"] for e in els(cls)]
        out.update({k: _pick(firsts, i) for i, k in keys.items()})
    for cls, keys in (params.get("class_multiObject_li") or {}).items():
        if isinstance(keys, list):  # which of these texts the class's list items show
            search[cls] = (list(keys), "li")
        else:
            out.update({k: _pick(els(cls)[0]["li"] if els(cls) else [], i) for i, k in keys.items()})
    for cls, (wanted, where) in search.items():
        texts = [t for e in els(cls) for t in e["li"]] if where == "li" else [e["text"] for e in els(cls)]
        out.update({w: w in texts for w in wanted if w != "is_other_exist"})
        if "is_other_exist" in wanted:
            out["is_other_exist"] = any(t not in wanted for t in texts)
    for xpath, key in (params.get("xpathObject") or {}).items():
        node = dom.get("x:" + xpath)
        out[key] = node["text"] if node else ""
    for xpath, key in (params.get("inputObject") or {}).items():
        node = dom.get("x:" + xpath)
        out[key] = (node.get("value") or "") if node else ""
    for s in params.get("url_include_expected") or []:
        out[s] = s in url
    for s, key in (params.get("url_include_expected_multichoice") or {}).items():
        if s in url:
            out[key] = s
    return out


@getter("active_tab_html_parse")
async def active_tab_html_parse(env: Any, params: dict[str, Any], ctx: Any) -> dict[str, Any] | None:
    """Texts picked out of the active page by class name, XPath or input field."""
    page = await _active(ctx)
    if page is None:
        return None
    classes = [c for k, v in params.items() if k.startswith("class_") for c in (v or {})]
    xpaths = [*(params.get("xpathObject") or {}), *(params.get("inputObject") or {})]
    query = json.dumps({"classes": classes, "xpaths": xpaths})
    await _chrome(ctx).wait_loaded(page)
    dom = await _chrome(ctx).evaluate(page, _DOM_JS % query) or {}
    return html_fields(params, dom, page.get("url", ""))


def _prefs(ctx: Any) -> dict[str, Any]:
    return _chrome(ctx).read_json("Default/Preferences")


@getter("enable_do_not_track")
async def enable_do_not_track(env: Any, params: dict[str, Any], ctx: Any) -> str:
    return "true" if _prefs(ctx).get("enable_do_not_track") else "false"


@getter("enable_safe_browsing")
async def enable_safe_browsing(env: Any, params: dict[str, Any], ctx: Any) -> str:
    return "true" if _prefs(ctx).get("safebrowsing", {}).get("enhanced") else "false"


@getter("new_startup_page")
async def new_startup_page(env: Any, params: dict[str, Any], ctx: Any) -> str:
    """"true" when Chrome opens the New Tab page on start (restore_on_startup 5, the default)."""
    session = _prefs(ctx).get("session")
    return "true" if session is None or session.get("restore_on_startup") == 5 else "false"


@getter("data_delete_automacally")
async def data_delete_automatically(env: Any, params: dict[str, Any], ctx: Any) -> str:
    """"true" when site data is deleted on exit (the cookies content setting is 4)."""
    values = _prefs(ctx).get("profile", {}).get("default_content_setting_values", {})
    return "true" if values.get("cookies") == 4 else "false"


@getter("profile_name")
async def profile_name(env: Any, params: dict[str, Any], ctx: Any) -> str | None:
    return _prefs(ctx).get("profile", {}).get("name")


@getter("default_search_engine")
async def default_search_engine(env: Any, params: dict[str, Any], ctx: Any) -> str:
    data = _prefs(ctx).get("default_search_provider_data", {})
    return data.get("template_url_data", {}).get("short_name", "Google")


@getter("chrome_font_size")
async def chrome_font_size(env: Any, params: dict[str, Any], ctx: Any) -> dict[str, Any]:
    defaults = {"default_fixed_font_size": 13, "default_font_size": 16, "minimum_font_size": 13}
    return {**defaults, **_prefs(ctx).get("webkit", {}).get("webprefs", {})}


@getter("enabled_experiments")
async def enabled_experiments(env: Any, params: dict[str, Any], ctx: Any) -> list[str]:
    return list(_chrome(ctx).read_json("Local State").get("browser", {}).get("enabled_labs_experiments", []))


@getter("bookmarks")
async def bookmarks(env: Any, params: dict[str, Any], ctx: Any) -> dict[str, Any]:
    return _chrome(ctx).read_json("Default/Bookmarks").get("roots", {})


@getter("find_unpacked_extension_path")
async def unpacked_extension_paths(env: Any, params: dict[str, Any], ctx: Any) -> list[str]:
    chrome = _chrome(ctx)
    settings = {}
    for name in ("Default/Secure Preferences", "Default/Preferences"):
        settings.update(chrome.read_json(name).get("extensions", {}).get("settings", {}))
    return [s["path"] for s in settings.values() if isinstance(s, dict) and "path" in s]


@getter("find_installed_extension_name")
async def installed_extension_names(env: Any, params: dict[str, Any], ctx: Any) -> list[str]:
    names = []
    for manifest in sorted((_chrome(ctx).profile / "Default" / "Extensions").glob("*/*/manifest.json")):
        try:
            names.append(json.loads(manifest.read_text(encoding="utf-8")).get("name", ""))
        except (OSError, ValueError):
            continue
    return names


def _query_copy(db: Path, sql: str) -> list[tuple[Any, ...]]:
    if not db.is_file():
        return []
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / db.name
        shutil.copyfile(db, copy)
        conn = sqlite3.connect(copy)
        try:
            return conn.execute(sql).fetchall()
        except sqlite3.Error as exc:
            raise EnvError(f"cannot read {db}: {exc}") from exc
        finally:
            conn.close()


@getter("history")
async def history(env: Any, params: dict[str, Any], ctx: Any) -> list[tuple[Any, ...]]:
    return _query_copy(_chrome(ctx).profile / "Default" / "History",
                       "SELECT url, title, last_visit_time FROM urls")


@getter("cookie_data")
async def cookie_data(env: Any, params: dict[str, Any], ctx: Any) -> list[tuple[Any, ...]]:
    return _query_copy(_chrome(ctx).profile / "Default" / "Cookies", "SELECT host_key, name, path FROM cookies")


@getter("shortcuts_on_desktop")
async def shortcuts_on_desktop(env: Any, params: dict[str, Any], ctx: Any) -> dict[str, str]:
    desktop = _chrome(ctx).home / "Desktop"
    return {p.name: p.read_text(encoding="utf-8", errors="replace") for p in sorted(desktop.glob("*.desktop"))}


register_all = getter.register_all
