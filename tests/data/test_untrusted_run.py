"""A run directory from someone else is data, never code (issue 54): every reader opens it through
the one `--run` helper, which refuses a store whose definitions would run a program or reach the
network and a run.json naming a store or broker the user did not, before anything runs or is
contacted; no password from the environment leaves. Real chdb stores, real loopback listeners,
`dart` as a user runs it (one process per reader: chdb opens one path per process)."""

from __future__ import annotations

import base64
import json
import os
import shutil
import socket
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = pytest.mark.clickhouse
REPO = Path(__file__).resolve().parents[2]
PASSWORD = "canary-clickhouse-secret"
KAFKA_PASSWORD = "canary-kafka-secret"
PLAINTEXT = {"DART_KAFKA_SECURITY_PROTOCOL": "", "DART_KAFKA_SASL_MECHANISM": "", "DART_KAFKA_USERNAME": "",
             "DART_KAFKA_PASSWORD": ""}


class Listener:
    """A loopback TCP server that answers any request with an HTTP 200 and records every byte."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.received: list[bytes] = []
        threading.Thread(target=self._serve, daemon=True).start()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                conn.settimeout(2)
                try:
                    self.received.append(conn.recv(65536))
                    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\nConnection: close\r\n\r\nOk.\n")
                except OSError:
                    pass

    def holds_a_password(self) -> bool:
        data = b"".join(self.received)
        return any(p.encode() in data or base64.b64encode(f"default:{p}".encode()) in data
                   for p in (PASSWORD, KAFKA_PASSWORD))


@pytest.fixture
def listeners() -> Iterator[dict[str, Listener]]:
    out = {name: Listener() for name in ("url_view", "store", "broker")}
    yield out
    for listener in out.values():
        listener.sock.close()


def build_store(path: Path, *statements: str) -> None:
    """A store as a data manager writes it (dart's schema, some rows, a dropped replay database),
    plus ``statements``; in a process of its own (one chdb path per process)."""
    script = textwrap.dedent(f"""
        from dart.data import projection
        from dart.data.store import Store
        from tests.data.factories import group, task
        store = Store.open_dsn("chdb://{path}", database="dart")
        store.migrate()
        projection.write_events(store, [task("t-1"), *group("t-1", [1.0, 0.0])[0]])
        scratch = Store(store.client, "dart_replay_1", store.target)
        scratch.migrate()
        store.command("DROP DATABASE dart_replay_1")
        for sql in {list(statements)!r}:
            store.command(sql)
        store.close()
    """)
    out = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": str(REPO)})
    assert out.returncode == 0, out.stderr


def exec_view(run: Path) -> str:
    scripts = run / "chdb" / "user_scripts"
    scripts.mkdir(parents=True, exist_ok=True)
    (scripts / "marker.sh").write_text(f"#!/bin/sh\ntouch {run.parent / 'MARKER'}\necho ran\n")
    (scripts / "marker.sh").chmod(0o755)
    return "CREATE VIEW dart.runs AS SELECT * FROM executable('marker.sh', TSV, 'x String')"


def url_view(listener: Listener) -> str:
    return f"CREATE VIEW dart.leak AS SELECT * FROM url('http://{listener.address}/x', TSV, 'x String')"


def descriptor(run: Path, **fields: object) -> None:
    data = {"run_id": "shared", "workdir": "/home/someone/runs/shared", "bootstrap": None, "prefix": "dart",
            "store_dsn": "chdb:///home/someone/runs/shared/chdb", "database": "dart",
            "blobs": "/home/someone/runs/shared/blobs", "log_dir": "/home/someone/runs/shared/log",
            "tensorboard": "/home/someone/runs/shared/tensorboard/shared", "config": None, "pid": None, **fields}
    (run / "run.json").write_text(json.dumps(data))


def dart(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    secrets = {"CLICKHOUSE_PASSWORD": PASSWORD, "DART_KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
               "DART_KAFKA_SASL_MECHANISM": "PLAIN", "DART_KAFKA_USERNAME": "me", "DART_KAFKA_PASSWORD": KAFKA_PASSWORD}
    return subprocess.run([sys.executable, "-m", "dart.cli", *argv], cwd=REPO, capture_output=True, text=True,
                          timeout=120, env={**os.environ, "PYTHONPATH": str(REPO), **secrets, **(env or {})})


def one_line(out: subprocess.CompletedProcess) -> str:
    assert out.returncode != 0, out.stdout + out.stderr
    assert "Traceback" not in out.stderr, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    return lines[0]


READERS = {
    "sql": ["sql", "SELECT count() FROM trajectories", "--run", "{run}"],
    "report": ["report", "--run", "{run}"],
    "replay": ["replay", "{run}"],
    "metrics": ["metrics", "{run}"],
    "trace": ["trace", "r-1", "--run", "{run}", "--out", "{tmp}/traces"],
    "eval": ["eval", "--run", "{run}", "--version", "1"],
    "tail": ["tail", "dart.trajectories", "--run", "{run}"],
    "replay decision": ["replay", "decision", "--run", "{run}", "r-1", "0"],
}


@pytest.fixture
def hostile(tmp_path: Path, listeners: dict[str, Listener]) -> Path:
    """An executable-calling view (its script in the store), a URL-reading view, run.json naming a
    foreign store and broker (and a live dart pid), and the store's HTTP pointer at a listener."""
    run = tmp_path / "run"
    (run / "log").mkdir(parents=True)
    build_store(run / "chdb", exec_view(run), url_view(listeners["url_view"]))
    descriptor(run, store_dsn=f"http://{listeners['store'].address}", bootstrap=listeners["broker"].address,
               pid=os.getpid())
    (run / "chdb.http").write_text(f"http://{listeners['store'].address}\n")
    return run


@pytest.mark.parametrize("reader", list(READERS))
def test_every_reader_refuses_a_hostile_run_with_one_line_running_and_contacting_nothing(
        hostile: Path, listeners: dict[str, Listener], tmp_path: Path, reader: str) -> None:
    argv = [a.format(run=hostile, tmp=tmp_path) for a in READERS[reader]]
    line = one_line(dart(*argv))
    assert "run.json names the store http://127.0.0.1" in line and "refused" in line
    assert not (tmp_path / "MARKER").exists()
    assert all(not listener.received for listener in listeners.values())
    assert not (tmp_path / "traces").exists()


@pytest.mark.parametrize("reader", ["sql", "report", "replay", "metrics", "tail"])
def test_a_store_holding_a_program_is_refused_naming_it_and_the_program_never_runs(
        tmp_path: Path, listeners: dict[str, Listener], reader: str) -> None:
    run = tmp_path / "run"
    (run / "log").mkdir(parents=True)
    build_store(run / "chdb", exec_view(run))
    line = one_line(dart(*[a.format(run=run, tmp=tmp_path) for a in READERS[reader]]))
    assert "user_scripts: not part of a chdb store" in line and "--trust-run" in line
    assert not (tmp_path / "MARKER").exists()
    # without the scripts folder the view itself is named, with the rule it breaks
    shutil.rmtree(run / "chdb" / "user_scripts")
    line = one_line(dart(*[a.format(run=run, tmp=tmp_path) for a in READERS[reader]]))
    assert "dart.runs: table function executable() is refused" in line


def test_a_url_view_is_refused_and_its_listener_never_hears_from_dart(
        tmp_path: Path, listeners: dict[str, Listener]) -> None:
    run = tmp_path / "run"
    build_store(run / "chdb", url_view(listeners["url_view"]))
    line = one_line(dart("sql", "SELECT * FROM leak", "--run", str(run)))
    assert "dart.leak: table function url() is refused" in line
    assert not listeners["url_view"].received


def test_the_attack_is_real_and_trust_run_still_runs_no_program_from_the_store(tmp_path: Path) -> None:
    run = tmp_path / "run"
    build_store(run / "chdb", exec_view(run))
    # chdb as it opens a path by itself: the store's own script runs, as this user (what dart prevents)
    copy = tmp_path / "copy"
    shutil.copytree(run, copy, symlinks=True)
    raw = subprocess.run([sys.executable, "-c", f"import chdb; c = chdb.connect({str(copy / 'chdb')!r}); "
                                                f"print(c.query('SELECT * FROM dart.runs', 'TSV'))"],
                         capture_output=True, text=True, timeout=120)
    assert raw.stdout.strip() == "ran" and (tmp_path / "MARKER").exists(), raw.stderr
    (tmp_path / "MARKER").unlink()
    # --trust-run skips the check, but dart's engine takes no scripts from a store (dart/data/chdb.xml)
    out = dart("sql", "SELECT * FROM runs", "--run", str(run), "--trust-run")
    assert out.returncode == 1 and "inside user scripts folder /proc/dart-no-user-scripts/" in out.stderr
    assert not (tmp_path / "MARKER").exists()


def test_a_store_pointer_gets_no_password_and_is_named_before_it_is_contacted(
        tmp_path: Path, listeners: dict[str, Listener]) -> None:
    run = tmp_path / "run"
    build_store(run / "chdb")
    endpoint = listeners["store"]
    (run / "chdb.http").write_text(f"http://{endpoint.address}\n")
    out = dart("sql", "SELECT 1", "--run", str(run))
    assert f"asking http://{endpoint.address} (from {run / 'chdb.http'})" in out.stderr.splitlines()[0]
    assert endpoint.received and not endpoint.holds_a_password()
    # an address off this machine is not contacted at all
    (run / "chdb.http").write_text("http://192.0.2.1:8123\n")
    line = one_line(dart("sql", "SELECT 1", "--run", str(run)))
    assert "names the SQL endpoint 'http://192.0.2.1:8123', not one on this machine: not contacted" in line


def test_a_run_json_broker_gets_no_kafka_password_unless_it_is_the_users(
        tmp_path: Path, listeners: dict[str, Listener]) -> None:
    run = tmp_path / "run"
    run.mkdir()
    broker = listeners["broker"]
    # a live `dart up` of this user, as run.json's pid must be
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", "dart", "up"])
    try:
        descriptor(run, bootstrap=broker.address, pid=proc.pid)
        line = one_line(dart("tail", "dart.trajectories", "--run", str(run), "--max", "1"))
        assert f"names the broker {broker.address}: not contacted (your Kafka credentials go only to " \
               "$DART_BOOTSTRAP)" in line
        assert not broker.received
        descriptor(run, bootstrap="192.0.2.1:9092", pid=proc.pid)
        line = one_line(dart("tail", "dart.trajectories", "--run", str(run), env=PLAINTEXT))
        assert "names the broker 192.0.2.1:9092: not contacted (it is not on this machine)" in line
    finally:
        proc.kill()
        proc.wait()


def test_a_data_managers_store_passes_the_check_and_reads_normally_from_a_copied_run(tmp_path: Path) -> None:
    original = tmp_path / "theirs"
    build_store(original / "chdb")
    descriptor(original, workdir=str(original), store_dsn=f"chdb://{original / 'chdb'}")
    run = tmp_path / "mine"
    shutil.copytree(original, run, symlinks=True)
    shutil.rmtree(original)  # run.json still names the old paths: the copy reads its own store
    out = dart("sql", "SELECT count() FROM trajectories FINAL", "--run", str(run), "--format", "TSV")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "2"
    report = dart("report", "--run", str(run), "--json")
    assert report.returncode == 0, report.stderr


UUID = "11111111-2222-4333-8444-555555555555"
HANDWRITTEN = {
    # a definition file written by hand, as someone sharing a run could: what the check names
    "refreshable view": (f"ATTACH MATERIALIZED VIEW _ UUID '{UUID}' REFRESH EVERY 1 SECOND (`x` String) "
                         "ENGINE = MergeTree ORDER BY x AS SELECT * FROM url('http://127.0.0.1:1/', TSV, 'x String')",
                         "not a table or a plain view"),
    "second statement": (f"ATTACH TABLE _ UUID '{UUID}' (`x` String) ENGINE = MergeTree ORDER BY x; "
                         "SELECT * FROM url('http://127.0.0.1:1/', TSV, 'x String')", "Multi-statements"),
    "disk setting": (f"ATTACH TABLE _ UUID '{UUID}' (`x` String) ENGINE = MergeTree ORDER BY x "
                     "SETTINGS disk = disk(type = local, path = '/tmp/')", "setting disk"),
    "ttl move": (f"ATTACH TABLE _ UUID '{UUID}' (`x` String, `d` DateTime) ENGINE = MergeTree ORDER BY x "
                 "TTL d + toIntervalDay(1) TO DISK 'x'", "TTL is refused"),
    "kafka engine": (f"ATTACH TABLE _ UUID '{UUID}' (`x` String) ENGINE = Kafka('127.0.0.1:1', 't', 'g', 'TSV')",
                     "table engine Kafka is refused"),
    "file in a default": (f"ATTACH TABLE _ UUID '{UUID}' (`x` String DEFAULT file('/etc/hostname')) "
                          "ENGINE = MergeTree ORDER BY x", "function file() is refused"),
    "view of a host file": (f"ATTACH VIEW _ UUID '{UUID}' (`x` String) AS SELECT * FROM default.`/etc/hostname`",
                            "default./etc/hostname is refused"),
    "dictionary": (f"CREATE DICTIONARY _ UUID '{UUID}' (`x` UInt64) PRIMARY KEY x "
                   "SOURCE(HTTP(URL 'http://127.0.0.1:1/' FORMAT TSV)) LAYOUT(FLAT()) LIFETIME(0)",
                   "not a table or a plain view"),
}


@pytest.fixture(scope="module")
def clean_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    store = tmp_path_factory.mktemp("clean") / "chdb"
    build_store(store)
    return store


def copy_of(store: Path, where: Path) -> Path:
    copy = where / "chdb"
    shutil.copytree(store, copy, symlinks=True)
    return copy


def test_a_data_managers_store_passes_the_check(clean_store: Path) -> None:
    from dart.data.storecheck import check_store

    assert list((clean_store / "metadata_dropped").glob("*.sql")), "a dropped database's tables are checked too"
    check_store(clean_store)


@pytest.mark.parametrize("case", list(HANDWRITTEN))
def test_the_check_refuses_each_handwritten_definition_that_would_run_or_reach_out(
        clean_store: Path, tmp_path: Path, case: str) -> None:
    from dart.data.storecheck import check_store
    from dart.rundir import UntrustedRun

    store = copy_of(clean_store, tmp_path)
    text, says = HANDWRITTEN[case]
    (store / "metadata" / "dart" / "evil.sql").write_text(text)
    with pytest.raises(UntrustedRun, match=r"evil\.sql") as refused:
        check_store(store)
    assert says in str(refused.value) and "--trust-run" in str(refused.value)


def test_the_check_refuses_a_foreign_database_engine_a_link_out_and_a_stray_definition(
        clean_store: Path, tmp_path: Path) -> None:
    from dart.data.storecheck import check_store
    from dart.rundir import UntrustedRun

    store = copy_of(clean_store, tmp_path)
    (store / "metadata" / "etc.sql").write_text("ATTACH DATABASE _ ENGINE = Filesystem('/etc')")
    with pytest.raises(UntrustedRun, match=r"metadata/etc\.sql: .*a database whose tables are elsewhere"):
        check_store(store)
    (store / "metadata" / "etc.sql").unlink()
    (store / "data" / "dart" / "outside").symlink_to("/etc")
    with pytest.raises(UntrustedRun, match=r"data/dart/outside: a link out of the store \(to /etc\)"):
        check_store(store)
    (store / "data" / "dart" / "outside").unlink()
    stray = store / "store" / "abc" / "abcdef00-0000-4000-8000-000000000000"
    stray.mkdir(parents=True)
    (stray / "t.sql").write_text(f"ATTACH TABLE _ UUID '{UUID}' (`x` String) ENGINE = MergeTree ORDER BY x")
    with pytest.raises(UntrustedRun, match="a definition of no database in the store"):
        check_store(store)


def test_eval_takes_no_desktop_config_a_run_directory_names(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / "mine.yaml").write_text("env:\n  backend: xdesktop\n")
    descriptor(run, config=str(run / "mine.yaml"))
    line = one_line(dart("eval", "--run", str(run)))
    assert f"names the config {run / 'mine.yaml'} (env.backend xdesktop" in line and "not one dart ships" in line
    assert "--trust-run" in line


def test_eval_takes_a_synthetic_screens_config_from_the_run_directory(tmp_path: Path) -> None:
    """Generated screens played in-process run nothing a config could name: such a config (a test's
    own tiny recipe, say) is taken, and eval goes on to look for the run's policy."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "mine.yaml").write_text("workdir: elsewhere\n")
    descriptor(run, config=str(run / "mine.yaml"))
    line = one_line(dart("eval", "--run", str(run)))
    assert "not one dart ships" not in line and f"no policy in {run / 'warm'}" in line, line
