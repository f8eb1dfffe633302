"""Secrets stay with their owner (issue 44): with ``--run-as`` the guest agent's task commands run
as the desktop user, who can read neither the agent's token file nor the agent's start-up
environment (``/proc/<agent pid>/environ``), while the agent and its token file are another user's."""

from __future__ import annotations

import asyncio
import os
import sys

import pytest

from dart.bus.broker import free_port
from dart.env.libvirt.agent_client import AgentClient
from dart.env.libvirt.testdriver import start_agent, stop_agent
from dart.env.xdesktop.display import XDisplay

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or sys.platform != "linux",
                                reason="needs root to run the agent's children as another user")
TOKEN = "run-as-token-0123456789abcdef"
SECRET = "bus-secret-run-as-0123456789"


async def test_task_commands_run_as_the_desktop_user_and_cannot_read_the_agents_secrets(tmp_path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    token_file.chmod(0o600)
    tmp_path.chmod(0o755)
    port = free_port()
    env = {**os.environ, "DART_TEST_BUS_PASSWORD": SECRET}
    display = XDisplay(width=320, height=240, home=tmp_path / "home", wm="")
    await display.start()
    try:
        proc = await asyncio.to_thread(start_agent, display.display, port, env=env,
                                       args=("--run-as", "nobody", "--token-file", str(token_file)))
    except BaseException:
        await display.close()
        raise
    client = AgentClient(f"http://127.0.0.1:{port}", token=TOKEN, timeout_s=20)
    try:
        who = await client.execute(["id", "-u"])
        assert who.returncode == 0 and who.stdout.strip() == "65534", who
        for argv in (["cat", str(token_file)], ["sh", "-c", "cat /proc/$PPID/environ"],
                     ["sh", "-c", f"cat /proc/{proc.pid}/environ"]):
            got = await client.execute(argv)
            assert got.returncode != 0, (argv, got)
            assert TOKEN not in got.stdout + got.stderr and SECRET not in got.stdout + got.stderr, argv
        assert proc.poll() is None
    finally:
        await client.close()
        await asyncio.to_thread(stop_agent, proc)
        await display.close()
