"""Chromium on a real Xvfb slot: OSWorld's chrome setup steps and browser getters through the
DevTools protocol, against pages served from a loopback HTTP server (no internet)."""

from __future__ import annotations

import contextlib
import shutil

import pytest

from dart.agent.actions import Finished
from dart.env.tasks import Task
from dart.env.xdesktop import XDesktopBackend, XDesktopConfig
from tests.env.conftest import serve_folder

pytestmark = [pytest.mark.xdesktop, pytest.mark.usefixtures("xdesktop_available"),
              pytest.mark.skipif(shutil.which("chromium") is None, reason="needs Debian's chromium")]
SMALL = XDesktopConfig(width=1024, height=768, ready_s=0.5, settle_s=0.2)

PAGES = {
    "a.html": "<html><head><title>A</title></head><body><div class='city'>Zurich</div>"
              "<div class='city'>Geneva</div><input id='q' value='typed'></body></html>",
    "b.html": "<html><head><title>B</title></head><body>b</body></html>",
    "c.html": "<html><head><title>C</title></head><body>c</body></html>",
}


@contextlib.contextmanager
def site(tmp_path):
    for name, html in PAGES.items():
        (tmp_path / name).write_text(html)
    with serve_folder(tmp_path) as base:
        yield base


def chrome_task(base: str, evaluator: dict) -> Task:
    return Task.from_dict({
        "id": "chrome-tabs", "instruction": "i",
        "config": [
            {"type": "launch", "parameters": {"command": ["google-chrome", "--remote-debugging-port=1337"]}},
            {"type": "launch", "parameters": {"command": ["socat", "tcp-listen:9222,fork", "tcp:localhost:1337"]}},
            {"type": "chrome_open_tabs", "parameters": {"urls_to_open": [f"{base}/b.html", f"{base}/c.html",
                                                                         f"{base}/a.html"]}},
            {"type": "chrome_close_tabs", "parameters": {"urls_to_close": [f"{base}/c.html"]}},
        ],
        "evaluator": evaluator,
    })


async def test_chrome_setup_opens_and_closes_tabs_and_the_getters_read_them(tmp_path):
    backend = XDesktopBackend(SMALL, slot=91)
    try:
        with site(tmp_path) as base:
            tabs = {"func": "is_expected_tabs", "result": {"type": "open_tabs_info"},
                    "expected": {"type": "rule", "rules": {"type": "url", "urls": [f"{base}/b.html"]}}}
            task = chrome_task(base, tabs)
            await backend.reset(task)
            pages = await backend.setup.chrome.pages()
            urls = sorted(p["url"] for p in pages)
            assert urls == [f"{base}/a.html", f"{base}/b.html"]  # the first URL took the start tab
            score, _ = await backend.evaluate(task, final_action=Finished())
            assert score == 0.0  # a.html is open too: the tab list does not match

            # a.html was opened last, so it is the active tab
            parse = {"func": ["is_expected_active_tab", "check_direct_json_object"],
                     "result": [{"type": "active_tab_info"},
                                {"type": "active_tab_html_parse", "category": "class",
                                 "class_multiObject": {"city": {"0": "from", "1": "to"}},
                                 "inputObject": {"//input[@id='q']": "query"}}],
                     "expected": [{"type": "rule", "rules": {"type": "url", "url": f"{base}/a.html"}},
                                  {"type": "rule", "rules": {"expected": {"from": "Zurich", "to": "Geneva",
                                                                          "query": "typed"}}}]}
            score, details = await backend.evaluate(chrome_task(base, parse), final_action=Finished())
            assert score == 1.0, details
    finally:
        await backend.close()


async def test_a_cookie_task_whose_pages_do_not_load_is_an_infra_error_not_a_free_score(tmp_path):
    """OSWorld's "delete Amazon's cookies" opens amazon.com in its setup; offline the pages never
    load, no cookie is set, and the evaluator would give 1 before any action."""
    import socket

    from dart.errors import EnvError

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}/shop.html"   # nothing listens there once closed
    cookies = {"func": "is_cookie_deleted", "result": {"type": "cookie_data", "dest": "Cookies"},
               "expected": {"type": "rule", "rules": {"type": "domains", "domains": [".amazon.com"]}}}

    def task(url: str) -> Task:
        return Task.from_dict({
            "id": "chrome-cookies", "instruction": "i",
            "config": [{"type": "launch", "parameters": {"command": ["google-chrome", "--remote-debugging-port=1337"]}},
                       {"type": "chrome_open_tabs", "parameters": {"urls_to_open": [url]}}],
            "evaluator": cookies})

    backend = XDesktopBackend(SMALL, slot=95)
    try:
        with pytest.raises(EnvError, match=r"shop.html did not load .*cookies it asks to delete"):
            await backend.reset(task(dead))
        with site(tmp_path) as base:
            await backend.reset(task(f"{base}/a.html"))   # a page that loads: the task sets up
    finally:
        await backend.close()
