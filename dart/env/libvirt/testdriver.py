"""The libvirt backend with no hypervisor: for tests, demos and benchmarks on any machine.

libvirt's in-process ``test:///default`` driver holds the domains (define, start, snapshot,
revert, destroy all work; there is no guest OS), and a real ``dart guest-agent`` on a local X
display (Xvfb) stands in for the guest: give its URL as the pool's ``agent_urls``. Domains of
``test:///default`` are shared by every connection of one process while any stays open.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request

TEST_TEMPLATE = """<domain type='test'>
  <name>${name}</name>
  <uuid>${uuid}</uuid>
  <metadata>${metadata}</metadata>
  <memory unit='MiB'>${memory_mib}</memory>
  <vcpu>${vcpus}</vcpu>
  <os><type arch='x86_64'>hvm</type></os>
</domain>
"""
"""A domain template for the test driver (no disk: leave ``base_image`` unset)."""


def free_port() -> int:
    """A TCP port free on loopback right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_agent(display: str, port: int, *, token: str | None = None, timeout_s: float = 20.0,
                args: tuple[str, ...] = (), env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """Start ``dart guest-agent`` on ``display`` at ``127.0.0.1:port`` (wanting ``token`` in every
    request when given; without one it answers this user's processes only, and a test running as
    root says it means to with ``--root-without-token``); return once it answers ``/health``
    (blocking: call it in a thread from async code)."""
    env = {k: v for k, v in (os.environ if env is None else env).items() if k != "DART_AGENT_TOKEN"}
    if token is not None:
        env["DART_AGENT_TOKEN"] = token
    elif os.geteuid() == 0:
        args = ("--root-without-token", *args)
    proc = subprocess.Popen(
        [sys.executable, "-m", "dart.cli", "guest-agent", "--display", display, "--port", str(port), *args],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True, env=env,
    )
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"guest agent exited: {proc.stderr.read().decode() if proc.stderr else ''}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1) as resp:
                if json.loads(resp.read())["ok"]:
                    return proc
        except OSError:
            time.sleep(0.05)
    stop_agent(proc)
    raise RuntimeError(f"guest agent on port {port} did not answer in {timeout_s} s")


def stop_agent(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM the agent (it stops what it launched), SIGKILL if it lingers; blocking."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
    if proc.stderr:
        with contextlib.suppress(OSError):
            proc.stderr.close()
