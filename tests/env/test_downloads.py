"""The download cache: `dart tasks fetch` from a loopback HTTP server or an inbox folder, the
cloud_file / cache_file getters, the xdesktop download step, and the missing-file error."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import dart.cli
from dart.cli import main
from dart.env import cli as env_cli
from dart.env.downloads import DownloadCache, MissingDownload, task_urls, url_name
from dart.env.evaluators import FileContent, evaluate_task
from dart.env.tasks import Task
from dart.env.xdesktop.setup import SetupRunner
from tests.env.conftest import serve_folder


@pytest.fixture(autouse=True)
def only_env_commands(monkeypatch):
    monkeypatch.setattr(dart.cli, "command_modules", lambda: [env_cli])


def task_file(tmp_path: Path, base: str) -> Path:
    t = {
        "id": "fetch-me", "instruction": "i",
        "config": [{"type": "download", "parameters": {"files": [
            {"url": f"{base}/start.txt", "path": "/home/user/start.txt"}]}}],
        "evaluator": {"func": "compare_text_file",
                      "result": {"type": "vm_file", "path": "/home/user/start.txt", "dest": "start.txt"},
                      "expected": {"type": "cloud_file", "path": f"{base}/gold.txt", "dest": "gold.txt"}},
    }
    p = tmp_path / "tasks" / "fetch-me.json"
    p.parent.mkdir()
    p.write_text(json.dumps(t))
    return p


def test_fetch_fills_the_cache_from_a_loopback_server_and_setup_and_getter_read_it(tmp_path, capsys):
    site = tmp_path / "site"
    site.mkdir()
    (site / "start.txt").write_text("hello")
    (site / "gold.txt").write_text("hello world")
    cache_root = tmp_path / "cache"
    with serve_folder(site) as base:
        path = task_file(tmp_path, base)
        assert main(["tasks", "fetch", str(path), "--downloads", str(cache_root)]) == 0
        assert "2 in the cache" in capsys.readouterr().out
        task = Task.from_dict(json.loads(path.read_text()))
        assert task_urls(task) == [f"{base}/start.txt", f"{base}/gold.txt"]
    # The server is gone: everything below reads the cache only.
    cache = DownloadCache(cache_root)
    assert cache.read(f"{base}/gold.txt") == b"hello world"

    class Display:
        home = tmp_path / "home"

    runner = SetupRunner(Display(), profile=tmp_path / "p", downloads=cache)  # type: ignore[arg-type]
    import asyncio

    asyncio.run(runner.run("download", task.config[0].parameters))
    assert (tmp_path / "home" / "start.txt").read_text() == "hello"

    class Env:
        async def read_file(self, p: str) -> bytes:
            return (tmp_path / "home" / Path(p).name).read_bytes()

    score, _ = asyncio.run(evaluate_task(task, Env(), final_action=None, extras={"downloads": cache}))
    assert score == 0.0  # "hello" is not "hello world": the getters delivered both files
    (tmp_path / "home" / "start.txt").write_text("hello world")
    score, _ = asyncio.run(evaluate_task(task, Env(), final_action=None, extras={"downloads": cache}))
    assert score == 1.0


def test_a_missing_file_names_the_url_the_inbox_path_and_the_command(tmp_path):
    cache = DownloadCache(tmp_path / "cache")
    url = "https://example.invalid/files/gold.xlsx"
    with pytest.raises(MissingDownload) as err:
        cache.read(url)
    msg = str(err.value)
    assert url in msg and "dart tasks fetch" in msg and f"inbox/{url_name(url)}" in msg
    assert isinstance(err.value, FileNotFoundError)


def test_fetch_from_an_inbox_folder_and_list_what_is_missing(tmp_path, capsys):
    base = "https://example.invalid/d"
    path = task_file(tmp_path, base)
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    (inbox / url_name(f"{base}/gold.txt")).write_text("gold")
    root = tmp_path / "cache"
    assert main(["tasks", "fetch", str(path), "--downloads", str(root), "--from", str(inbox)]) == 1
    out = capsys.readouterr().out
    assert f"{base}/start.txt" in out and "1 missing" in out
    cache = DownloadCache(root)
    assert cache.read(f"{base}/gold.txt") == b"gold"
    assert main(["tasks", "fetch", str(path), "--downloads", str(root), "--list"]) == 1
    assert url_name(f"{base}/start.txt") in capsys.readouterr().out


def test_cloud_file_multi_gives_the_picked_files(tmp_path):
    import asyncio

    cache = DownloadCache(tmp_path)
    urls = [f"http://127.0.0.1:1/{n}" for n in ("a", "b", "c")]
    for u in urls:
        cache.put(u, u[-1].encode())
    t = Task.from_dict({"id": "m", "instruction": "i", "evaluator": {
        "func": "exact_match", "result": {"type": "rule", "rules": {"expected": "x"}},
        "expected": {"type": "cloud_file", "path": urls, "multi": "true", "gives": [0, 2]}}})
    from dart.env.evaluators import EvalContext, fetch

    got = asyncio.run(fetch(t.evaluator.expected[0], None, EvalContext(task=t, final_action=None,  # type: ignore[arg-type]
                                                                       extras={"downloads": cache})))
    assert [f.data for f in got] == [b"a", b"c"] and all(isinstance(f, FileContent) for f in got)
