"""Supervised service processes for `dart up`.

Each service is a `dart ...` subprocess with its output in its own log file. A service that
exits while it should be running is restarted (with back-off, a bounded number of times)
and the supervisor says so; Ctrl-C / SIGTERM sends SIGTERM to every service, waits for them
to finish their in-flight work and commit, and only then returns, so the log and the store
are left consistent.
"""

from __future__ import annotations

import datetime
import json
import logging
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class ServiceSpec:
    name: str
    """Unique name (env-0, rollout-1, trainer, data-manager)."""
    argv: tuple[str, ...]
    """Arguments after `dart` (e.g. ("env-worker", "--config", "env-0.yaml"))."""
    restart: bool = True
    """Restart the service when it exits before the stack stops."""
    max_restarts: int = 5
    env: dict[str, str] = field(default_factory=dict)
    nice: int = 0
    """CPU priority below the supervisor's (0-19): on a shared machine the producers (env and
    rollout workers, which can always make more samples) yield the CPU to the trainer."""


@dataclass
class _Running:
    spec: ServiceSpec
    proc: subprocess.Popen[bytes]
    started_at: float
    restarts: int = 0
    state: str = "running"
    log_path: Path | None = None


def _lower_priority(nice: int):
    """Runs in the child after its setsid: lowers its priority by ``nice``. With the kernel's
    autogroup scheduling (the default on desktops and many servers) a new session is a group of
    its own whose weight only /proc/self/autogroup sets; the thread nice value counts only
    inside the group, so both are set."""

    def lower() -> None:
        os.nice(nice)
        try:
            with open("/proc/self/autogroup", "w") as f:
                f.write(str(nice))
        except OSError:
            pass  # no autogroup on this kernel: the nice value alone applies

    return lower


def start_line(spec: ServiceSpec, *, json_lines: bool) -> str:
    """The line a service's log gets before each start: a JSON object when its lines are JSON."""
    if json_lines:
        return json.dumps({"time": datetime.datetime.now(datetime.UTC).isoformat(timespec="milliseconds")
                           .replace("+00:00", "Z"), "level": "INFO", "logger": "dart.stack.supervisor",
                           "message": f"starting dart {' '.join(spec.argv)}", "worker_id": spec.name}) + "\n"
    return f"\n==== {time.strftime('%H:%M:%S')} starting dart {' '.join(spec.argv)}\n"


class Supervisor:
    """Starts, watches, restarts and stops a set of services."""

    def __init__(self, logdir: Path, *, python: str = sys.executable, base_env: dict[str, str] | None = None) -> None:
        self.logdir = Path(logdir)
        self.logdir.mkdir(parents=True, exist_ok=True)
        self.python = python
        self.base_env = {**os.environ, **(base_env or {})}
        self.services: dict[str, _Running] = {}
        self.events: list[str] = []
        """Human-readable lines about starts, crashes and restarts (the progress display shows them)."""

    def _spawn(self, spec: ServiceSpec) -> subprocess.Popen[bytes]:
        log_path = self.logdir / f"{spec.name}.log"
        out = open(log_path, "ab")  # noqa: SIM115 - owned by the child for its whole life
        env = {**self.base_env, **spec.env}
        out.write(start_line(spec, json_lines=env.get("DART_LOG_FORMAT") == "json").encode())
        out.flush()
        return subprocess.Popen([self.python, "-m", "dart.cli", *spec.argv], stdout=out, stderr=subprocess.STDOUT,
                                env=env, start_new_session=True,
                                preexec_fn=_lower_priority(spec.nice) if spec.nice else None)

    def start(self, spec: ServiceSpec) -> None:
        if spec.name in self.services:
            raise ValueError(f"service {spec.name} already started")
        proc = self._spawn(spec)
        self.services[spec.name] = _Running(spec, proc, time.monotonic(), log_path=self.logdir / f"{spec.name}.log")
        self._say(f"{spec.name}: started (pid {proc.pid})")

    def _say(self, line: str) -> None:
        self.events.append(f"{time.strftime('%H:%M:%S')} {line}")
        log.info(line)

    def poll(self) -> None:
        """Restart services that died; call this every second or so."""
        for name, run in self.services.items():
            if run.state != "running":
                continue
            code = run.proc.poll()
            if code is None:
                continue
            if not run.spec.restart:
                run.state = "exited" if code == 0 else f"failed ({code})"
                self._say(f"{name}: exited with code {code}")
                continue
            if run.restarts >= run.spec.max_restarts:
                run.state = f"failed ({code})"
                self._say(f"{name}: exited with code {code}; gave up after {run.restarts} restarts "
                          f"(see {run.log_path})")
                continue
            run.restarts += 1
            backoff = min(10.0, 0.5 * 2 ** (run.restarts - 1))
            self._say(f"{name}: crashed with code {code}; restarting in {backoff:.1f} s "
                      f"({run.restarts}/{run.spec.max_restarts}, log {run.log_path})")
            time.sleep(backoff)
            run.proc = self._spawn(run.spec)
            run.started_at = time.monotonic()

    def status(self) -> dict[str, str]:
        return {name: run.state for name, run in self.services.items()}

    def stop(self, names: list[str] | None = None, timeout_s: float = 30.0) -> None:
        """SIGTERM the services (all, or ``names`` in that order), wait, then SIGKILL stragglers."""
        targets = [self.services[n] for n in (names or list(self.services))]
        for run in targets:
            if run.proc.poll() is None:
                run.state = "stopping"
                run.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        for run in targets:
            remaining = max(0.1, deadline - time.monotonic())
            try:
                run.proc.wait(remaining)
                run.state = "stopped"
            except subprocess.TimeoutExpired:
                run.proc.kill()
                run.proc.wait()
                run.state = "killed"
                self._say(f"{run.spec.name}: did not stop within {timeout_s:.0f} s; killed")
        self._say(f"stopped {', '.join(r.spec.name for r in targets)}")

    def start_again(self, names: list[str]) -> None:
        """Start stopped services anew (after the broker was rebuilt); restart counts are kept."""
        for name in names:
            run = self.services[name]
            if run.proc.poll() is None:
                continue
            run.proc = self._spawn(run.spec)
            run.started_at = time.monotonic()
            run.state = "running"
            self._say(f"{name}: started again (pid {run.proc.pid})")

    def any_failed(self) -> bool:
        return any(r.state.startswith("failed") for r in self.services.values())
