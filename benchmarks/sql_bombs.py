"""The SQL endpoint under issue 54's parsing bombs, this tree against a baseline revision.

Each pass starts the endpoint in a process of its own (this tree's code, or the baseline's from
``git archive``), then from this process: two clients each send the comment bomb (an anonymous
~180 KB ``INSERT /* /* ... */``) while a third sends ``SELECT count() FROM tasks`` every 0.1 s;
then ten requests whose URL (8 KB) ends in ``FORMAT a`` and spaces; then, as the writer, three
79-byte ``ALTER TABLE tasks UPDATE ...`` and the growth of the endpoint's resident memory (right
after them and 3 s later).
Passes alternate baseline and this tree; medians and ranges over passes are printed.

    .venv/bin/python benchmarks/sql_bombs.py [--baseline dd60c3e] [--passes 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BOMB = ("INSERT " + "/* " * 60_000 + "*/").encode()
TAIL = "?query=INSERT+INTO+t+FORMAT+a" + "+" * 7_900 + "b"
GROW = "ALTER TABLE tasks UPDATE instruction = repeat(repeat('x', 1000000), 60) WHERE 1"
PASSWORD = "bench-writer-password"


async def serve(path: Path, port_file: Path) -> None:
    """The endpoint as the data manager builds it, over a store with one task (runs in the child)."""
    from dart.data.http import SqlServer, Writer
    from dart.data.store import Store

    store = Store.open_dsn(f"chdb://{path}", database="dart")
    store.migrate()
    store.command("INSERT INTO dart.tasks (task_id, instruction) VALUES ('a', 'x'), ('b', 'y'), ('c', 'z')")
    server = SqlServer(path, writer=Writer.from_secret("dart_writer", PASSWORD), database="dart")
    port_file.write_text(f"{await server.start()}\n")
    await asyncio.Event().wait()


def post(url: str, body: bytes, headers: dict | None = None, method: str = "POST") -> tuple[int, float]:
    t0 = time.monotonic()
    req = urllib.request.Request(url, data=body if method == "POST" else None, headers=headers or {}, method=method)
    try:
        with urllib.request.urlopen(req, timeout=300) as r:
            r.read()
            status = r.status
    except urllib.error.HTTPError as e:
        status = e.code
    return status, time.monotonic() - t0


def rss_mb(pid: int) -> float:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmRSS:"))) / 1024


def one_pass(code_root: Path) -> dict[str, float]:
    """Start the endpoint from ``code_root`` and measure the three attacks against it."""
    with tempfile.TemporaryDirectory(prefix="sql-bombs-") as tmp:
        port_file = Path(tmp) / "port"
        env = {**os.environ, "PYTHONPATH": str(code_root)}
        proc = subprocess.Popen([sys.executable, __file__, "--serve", str(Path(tmp) / "chdb"), str(port_file)], env=env,
                                cwd=tmp, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            while not (port_file.exists() and port_file.read_text().endswith("\n")):
                assert proc.poll() is None, "the endpoint did not start"
                time.sleep(0.1)
            url = f"http://127.0.0.1:{int(port_file.read_text())}/"
            return {**comment_bomb(url), **format_tail(url), **alter_growth(url, proc.pid)}
        finally:
            proc.terminate()
            proc.wait(30)


def comment_bomb(url: str) -> dict[str, float]:
    bombs: list[float] = []
    probes: list[float] = []

    def bomb() -> None:
        bombs.append(post(url, BOMB)[1])

    threads = [threading.Thread(target=bomb) for _ in range(2)]
    for t in threads:
        t.start()
    while any(t.is_alive() for t in threads):
        status, took = post(url, b"SELECT count() FROM tasks")
        assert status == 200, status
        probes.append(took)
        time.sleep(0.1)
    return {"bomb_s": max(bombs), "probe_max_s": max(probes), "probe_median_s": statistics.median(probes)}


def format_tail(url: str) -> dict[str, float]:
    return {"format_tail_s": statistics.median(post(url + TAIL, b"x")[1] for _ in range(10))}


def alter_growth(url: str, pid: int) -> dict[str, float]:
    before = rss_mb(pid)
    writer = {"X-ClickHouse-User": "dart_writer", "X-ClickHouse-Key": PASSWORD}
    accepted = sum(post(url, GROW.encode(), writer)[0] == 200 for _ in range(3))
    right_after = rss_mb(pid)
    time.sleep(3.0)  # mutations run in the background
    return {"alter_accepted": accepted, "alter_rss_growth_mb": right_after - before,
            "alter_rss_growth_3s_mb": rss_mb(pid) - before}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--baseline", default="dd60c3e", help="git revision to compare with")
    ap.add_argument("--passes", type=int, default=3)
    ap.add_argument("--serve", nargs=2, metavar=("CHDB_PATH", "PORT_FILE"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve:
        asyncio.run(serve(Path(args.serve[0]), Path(args.serve[1])))
        return
    with tempfile.TemporaryDirectory(prefix="sql-bombs-base-") as base:
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", args.baseline, "dart"], check=True,
                                 capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", base], input=archive, check=True)
        runs: dict[str, list[dict[str, float]]] = {"baseline": [], "this tree": []}
        for _ in range(args.passes):
            for name, root in (("baseline", Path(base)), ("this tree", ROOT)):
                runs[name].append(one_pass(root))
                print(name, json.dumps(runs[name][-1]), flush=True)
    for name, results in runs.items():
        summary = {k: f"{statistics.median(r[k] for r in results):.3f} ({min(r[k] for r in results):.3f}-"
                      f"{max(r[k] for r in results):.3f})" for k in results[0]}
        print(f"{name} ({args.baseline if name == 'baseline' else 'HEAD + working tree'}), median (range) of "
              f"{args.passes}: {summary}")


if __name__ == "__main__":
    main()
