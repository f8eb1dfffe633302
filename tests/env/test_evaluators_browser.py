"""Browser metrics and the pure parts of the browser getters: relative dates, DOM picks, URLs."""

from __future__ import annotations

import datetime as dt

from dart.env.evaluators import get_metric
from dart.env.evaluators.metrics_chrome import normalize_url
from dart.env.evaluators.relative_time import fill, relative_date, resolve
from dart.env.xdesktop.chrome_getters import html_fields

WED = dt.date(2024, 5, 15)  # a Wednesday


def test_relative_dates_of_osworld_phrases():
    assert relative_date("tomorrow", WED) == dt.date(2024, 5, 16)
    assert relative_date("next Monday", WED) == dt.date(2024, 5, 20)
    assert relative_date("next Wednesday", WED) == dt.date(2024, 5, 22)  # never today
    assert relative_date("next week Saturday", WED) == dt.date(2024, 5, 25)
    assert relative_date("10th next month", WED) == dt.date(2024, 6, 10)
    assert relative_date("first monday eight months later", WED) == dt.date(2025, 1, 6)
    assert fill("{DoW}, {Month} {DayD} {Year} ({month}, {MonthD}/{Day0D})", dt.date(2024, 6, 3)) == \
        "Mon, Jun 3 2024 (june, 6/03)"


def test_from_and_to_dates_fill_the_two_halves_of_the_expected_keys():
    rules = {"relativeTime": {"from": "next Monday split", "to": "next Friday split"},
             "expected": {"puDay": "{DayD}", "puMonth": "{MonthD}", "doDay": "{DayD}", "doMonth": "{MonthD}"}}
    assert resolve(rules, WED)["expected"] == {"puDay": "20", "puMonth": "5", "doDay": "17", "doMonth": "5"}


def test_html_fields_follow_the_getter_params():
    dom = {"c:city": [{"text": "Zurich", "children": ["Z"], "li": []}, {"text": "Geneva", "children": [], "li": []}],
           "c:tags": [{"text": "nike", "children": [], "li": []}, {"text": "adidas", "children": [], "li": []}],
           "x://h1": {"text": "Title", "value": None}, "x://input": {"text": "", "value": "typed"}}
    params = {"class_singleObject": {"city": "first"}, "class_multiObject": {"city": {"1": "second"},
                                                                             "tags": ["nike", "women"]},
              "xpathObject": {"//h1": "title"}, "inputObject": {"//input": "query"},
              "url_include_expected": ["women"]}
    out = html_fields(params, dom, "https://shop/women")
    assert out == {"first": "Zurich", "second": "Geneva", "title": "Title", "query": "typed", "nike": True,
                   "women": True, "is_other_exist": True}


def test_browser_metrics():
    assert normalize_url("https://www.Example.com/a/") == normalize_url("http://example.com/a")
    tabs = [{"url": "https://www.airbnb.com/"}, {"url": "https://www.lonelyplanet.com/"}]
    assert get_metric("is_expected_tabs")(tabs, {"urls": ["https://www.lonelyplanet.com", "https://www.airbnb.com"]}) == 1.0
    assert get_metric("is_expected_tabs")(tabs[:1], {"urls": ["https://www.lonelyplanet.com"]}) == 0.0
    assert get_metric("is_expected_active_tab")({"url": "https://www.nfl.com/scores/2019/post4"},
                                                {"type": "url", "url": "https://www.nfl.com/scores/2019/post4"}) == 1.0
    bar = {"bookmark_bar": {"children": [{"type": "folder", "name": "Favorites", "children": []}]}}
    assert get_metric("is_expected_bookmarks")(bar, {"type": "bookmark_bar_folders_names", "names": ["Favorites"]}) == 1.0
    assert get_metric("is_cookie_deleted")([(".amazon.com", "x", "/")], {"type": "domains", "domains": [".amazon.com"]}) == 0.0
    assert get_metric("is_cookie_deleted")([], {"type": "domains", "domains": [".amazon.com"]}) == 1.0
    assert get_metric("check_history_deleted")([("https://www.youtube.com/watch", "t", 1)],
                                               {"type": "keywords", "keywords": ["youtube"]}) == 0.0
    assert get_metric("check_font_size")({"default_font_size": 20}, {"type": "range", "min": 16, "max": 99999}) == 1.0
