"""deploy/compose/healthcheck.py: a dart container is healthy when its service process is alive
and the event log answers (checked against the suite's real broker)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from dart.bus import DevBroker, free_port
from tests.deploy.stack import load_healthcheck

hc = load_healthcheck()

CONSOLE = ["/usr/local/bin/python", "/usr/local/bin/dart", "data-manager", "--config", "/etc/dart/dm.yaml"]


@pytest.mark.parametrize(
    ("argv", "command", "expected"),
    [
        (CONSOLE, ["data-manager"], True),
        (["dart", "train", "/etc/dart/trainer.yaml"], ["train"], True),
        (["dart", "train", "/etc/dart/trainer.yaml"], ["trainer"], False),
        (["python", "-m", "dart.cli", "rollout-worker"], ["rollout-worker"], True),
        (["dart", "topics", "ensure"], ["topics", "ensure"], True),
        (["dart", "topics", "list"], ["topics", "ensure"], False),
        (["sh", "-c", "dart data-manager"], ["data-manager"], False),  # a shell line is not the process
        (["/opt/bin/notdart", "data-manager"], ["data-manager"], False),
        (["python", "dart.cli", "data-manager"], ["data-manager"], False),  # dart.cli without -m
    ],
)
def test_runs_command_matches_dart_argv_only(argv: list[str], command: list[str], expected: bool) -> None:
    assert hc.runs_command(argv, command) is expected


def test_runs_command_needs_a_command() -> None:
    with pytest.raises(ValueError, match="name the dart command"):
        hc.runs_command(CONSOLE, [])


def fake_proc(root: Path, processes: dict[str, bytes | None]) -> Path:
    """A /proc-shaped directory: pid -> raw cmdline (None: no cmdline file, like a vanished pid)."""
    for pid, cmdline in processes.items():
        (root / pid).mkdir(parents=True)
        if cmdline is not None:
            (root / pid / "cmdline").write_bytes(cmdline)
    (root / "self").mkdir()
    return root


def test_process_argvs_reads_nul_separated_cmdlines_and_skips_the_rest(tmp_path: Path) -> None:
    root = fake_proc(tmp_path, {"1": b"\0".join(a.encode() for a in CONSOLE) + b"\0", "2": b"", "3": None,
                                "40": b"sleep\0inf\0"})
    assert sorted(hc.process_argvs(root)) == sorted([CONSOLE, ["sleep", "inf"]])


def test_process_argvs_sees_this_test_process() -> None:
    mine = [a for a in hc.process_argvs() if a == list(Path(f"/proc/{os.getpid()}/cmdline").read_bytes()
                                                        .rstrip(b"\0").decode().split("\0"))]
    # (under pytest-xdist this process is a worker: `python -c ...`, not `pytest`)
    assert mine and any(word in mine[0][0] for word in ("python", "pytest"))


def test_check_names_the_failing_part() -> None:
    assert hc.check(["data-manager"], [CONSOLE], True, "kafka:9092") is None
    assert "no process runs `dart train`" in hc.check(["train"], [CONSOLE], True, "kafka:9092")
    assert "does not answer at kafka:9092" in hc.check(["data-manager"], [CONSOLE], False, "kafka:9092")


@pytest.mark.kafka
def test_main_is_healthy_with_the_service_and_a_live_broker(
    broker: DevBroker, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    root = fake_proc(tmp_path, {"1": b"\0".join(a.encode() for a in CONSOLE)})
    monkeypatch.setenv("DART_BOOTSTRAP", broker.bootstrap)
    assert hc.main(["data-manager"], proc_root=root) == 0
    assert capsys.readouterr().out.startswith("healthy: dart data-manager")


@pytest.mark.kafka
def test_main_is_unhealthy_when_the_broker_is_gone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    root = fake_proc(tmp_path, {"1": b"\0".join(a.encode() for a in CONSOLE)})
    dead = f"127.0.0.1:{free_port()}"
    monkeypatch.setenv("DART_BOOTSTRAP", dead)
    assert hc.main(["data-manager"], proc_root=root, timeout_s=0.5) == 1
    assert f"does not answer at {dead}" in capsys.readouterr().out


def test_main_is_unhealthy_without_the_service_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    root = fake_proc(tmp_path, {"1": b"sleep\0inf"})
    monkeypatch.setenv("DART_BOOTSTRAP", "127.0.0.1:1")  # never contacted: the process check fails first
    assert hc.main(["env-worker"], proc_root=root) == 1
    assert "no process runs `dart env-worker`" in capsys.readouterr().out
    assert hc.main([], proc_root=root) == 2
